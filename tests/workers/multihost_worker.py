"""Run as a rank on namespace hosts (tools/netns.py): commrt across hosts over gloo.

argv[1]: a directory; every rank writes ``rank<r>.json`` there.

What each rank reports:

* its launch as commrt saw it (rank, local rank and size) and the default
  ``Torus2D()`` grid;
* ``commrt.all_reduce`` (ring, halving_doubling, torus2d, auto) against a
  float64 reference every rank computes from every rank's seeded inputs;
* the bytes it sent to each peer during one ring and one torus2d
  all-reduce (a counting wrapper around the transport), split into peers
  on its own host and on other hosts, the host of each rank coming from
  the harness (GROUP_RANK), not from the rank numbering;
* GradientSync against DDP (fp32, 10 steps) with ring, the default
  torus and auto, and a digest of the final parameters (equal on every rank);
* ``auto``'s model's choice at 64 KiB and 16 MiB, with its predicted times
  (bench/bench_sim_calibration.py times them all on these hosts).
"""

import collections
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ddp_reference import rel_err, train_commrt, train_ddp  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import Torus2D  # noqa: E402
from commrt.algorithms.auto import Auto, choices  # noqa: E402
from commrt.collectives.core import gather_rows  # noqa: E402
from commrt.transports.counting import CountingTransport  # noqa: E402
from commrt.tuning.hook_comm import HookComm  # noqa: E402
from commrt.tuning.probe import probe  # noqa: E402
from commrt.tuning.topology import ranks_per_node  # noqa: E402

ALGORITHMS = ("ring", "halving_doubling", "torus2d", "auto")
SIZES = (1, 1000, 100_003)
GRADSYNC_STEPS = 10
MODEL_SIZES = (64 << 10, 16 << 20)


def inputs(rank, n):
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + 7 * rank + n))


def check_all_reduce(comm):
    failures = []
    for alg in ALGORITHMS:
        for n in SIZES:
            everyone = torch.stack([inputs(r, n) for r in range(comm.world_size)]).double()
            ref, mag = everyone.sum(0), everyone.abs().sum(0)
            t = inputs(comm.rank, n)
            commrt.all_reduce(t, comm, algorithm=alg, op="sum")
            excess = ((t.double() - ref).abs() - 1e-6 * mag).max().item()
            if excess > 0:
                failures.append({"algorithm": alg, "n": n, "excess": excess})
    return failures


def bytes_by_host(comm, counter, hosts):
    me = hosts[comm.rank]
    off = sum(b for peer, b in counter.items() if hosts[peer] != me)
    return {"off_host": off, "on_host": sum(counter.values()) - off}


def count_bytes(comm, hosts, numel):
    out = {}
    for alg in ("ring", "torus2d"):
        # the first call of a signature also agrees it across ranks: count a repeat only
        commrt.all_reduce(torch.ones(numel), comm, algorithm=alg, op="sum")
        before = collections.Counter(comm.transport.bytes_by_peer)
        commrt.all_reduce(torch.ones(numel), comm, algorithm=alg, op="sum")
        out[alg] = bytes_by_host(comm, comm.transport.bytes_by_peer - before, hosts)
    return out


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def gradsync_vs_ddp(comm):
    port = int(os.environ["MASTER_PORT"]) + 1  # commrt's own store holds MASTER_PORT
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
        rank=comm.rank,
        world_size=comm.world_size,
    )
    try:
        ddp = train_ddp(comm.rank, False, steps=GRADSYNC_STEPS)
    finally:
        dist.destroy_process_group()
    out = {}
    for alg in ("ring", "torus2d", "auto"):
        model, nbuckets = train_commrt(comm, comm.rank, False, steps=GRADSYNC_STEPS, algorithm=alg)
        out[alg] = {"rel_err": rel_err(model, ddp), "buckets": nbuckets, "digest": digest(model)}
    return out


def model_choices(comm, sizes):
    """What ``auto``'s model (not learning) picks at each size on this network, once
    probed, and its predicted time per candidate."""
    auto = Auto(learn=False)
    out = {}
    for nbytes in sizes:
        commrt.all_reduce(torch.ones(nbytes // 4), comm, algorithm=auto, op="sum")
        choice = choices(comm)[nbytes]
        out[str(nbytes)] = {"choice": choice.label, "predicted": dict(choice.candidates)}
    return out


def main(out_dir):
    comm = commrt.init(timeout=120)
    comm.transport = CountingTransport(comm.transport)
    host = int(os.environ["GROUP_RANK"])
    hosts = [int(r[0]) for r in gather_rows(comm, [host])]
    p = comm.world_size
    report = {
        "rank": comm.rank,
        "world_size": p,
        "backend": comm.backend.value,
        "host": host,
        "hosts": hosts,
        "local_rank": comm.local_rank,
        "local_size": comm.local_size,
        "ranks_per_node": ranks_per_node(comm),
        "torus_shape": list(Torus2D().shape(p, comm.local_size)),
        "torus_schedule": Torus2D().select(p, 4096, HookComm(comm)).num_steps,
    }
    report["failures"] = check_all_reduce(comm)
    report["numel"] = numel = p * 1024
    report["bytes"] = count_bytes(comm, hosts, numel)
    report["gradsync"] = gradsync_vs_ddp(comm)
    pr = probe(comm)
    report["probe"] = pr.to_dict()
    report["network"] = pr.network().describe()
    report["overhead"] = repr(pr.network().overhead)  # what auto prices with
    report["model"] = model_choices(comm, MODEL_SIZES)
    comm.close()
    with open(os.path.join(out_dir, f"rank{report['rank']}.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
