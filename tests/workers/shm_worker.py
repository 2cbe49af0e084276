"""Ranks over the shared-memory transport, torchrun-style (tests/multiprocess/test_shm_transport.py).

    shm_worker.py MODE OUTDIR

* ``death``: after one all-reduce the last rank SIGKILLs itself (writing the time to
  OUTDIR/killed); the others' next all-reduce must fail naming it, and the abort hook
  end the job, long before the 120 s timeout.
* ``refuse``: rank 1 pretends it cannot share memory (SHM_PRETEND_ELSEWHERE).
  ``commrt.init("shm")`` must fail on every rank with the same reason, and a
  torch.distributed group on backend "commrt" must fall back to gloo and still
  sum right. Every rank writes OUTDIR/rank<r>.json.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.mp import die_after_one_all_reduce  # noqa: E402

import commrt  # noqa: E402
import commrt.distributed  # noqa: E402, F401  (registers the backend)
from commrt.transports import shm_connect  # noqa: E402


def death(out):
    comm = commrt.init("shm", timeout=120, stall_s=0)
    die_after_one_all_reduce(comm, out)  # the abort hook ends the job, naming the dead rank


def refuse(out):
    rank = int(os.environ["RANK"])
    if rank == 1:
        shm_connect.unusable = lambda: "pretend: elsewhere"
    report = {}
    try:
        commrt.init("shm", timeout=60, stall_s=0)
    except ValueError as e:
        report["init_error"] = str(e)
    dist.init_process_group("commrt")
    group = dist.group.WORLD
    report["cpu_transport"] = group.devices.get(torch.device("cpu")).comm.backend.value
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    report["sum"] = t[0].item()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    {"death": death, "refuse": refuse}[sys.argv[1]](sys.argv[2])
