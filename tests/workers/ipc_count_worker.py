"""Ranks that count what the ``cuda_ipc`` transport waits on per all-reduce, on the strict
CPU stand-in device (tests/multiprocess/test_cuda_ipc_counts.py).

    ipc_count_worker.py OUTDIR ALGORITHMS SIZES

ALGORITHMS and SIZES (bytes) are comma-separated. For each algorithm, size and dtype
(fp32, bf16) a rank runs the all-reduce :data:`WARM` times, then once counted
(:func:`commrt.testing.counted`): a call in the steady state, past the first call's
agreement and auto's learning. Every rank writes OUTDIR/rank<r>.json: per case, the
cross-process waits per peer, launches, host waits for the stream, the error against a
float64 sum of the same inputs, and a hash of the result's bytes (every rank must get
the same bits). None of this is a GPU result.
"""

import hashlib
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.engines import init_with  # noqa: E402
from helpers.ipc_standin import StandInDevice  # noqa: E402

import commrt  # noqa: E402
from commrt.testing import counted  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
#: calls before the counted one
WARM = 3


def _inputs(p, n, dtype):
    return [torch.randn(n, generator=torch.Generator().manual_seed(r)).to(dtype)
            for r in range(p)]  # fmt: skip


def case(comm, algorithm, nbytes, dtype) -> dict:
    n = max(1, nbytes // dtype.itemsize)
    xs = _inputs(comm.world_size, n, dtype)
    want = torch.stack([x.double() for x in xs]).sum(0)
    for _ in range(WARM):
        t = xs[comm.rank].clone()
        commrt.all_reduce(t, comm, algorithm=algorithm, op="sum")
    t = xs[comm.rank].clone()
    with counted(comm) as counts:
        commrt.all_reduce(t, comm, algorithm=algorithm, op="sum")
    peers = [q for q in range(comm.world_size) if q != comm.rank]
    return {
        "waits": [counts.peer_waits[q] for q in peers],
        "launches": counts.launches,
        "stream_waits": counts.stream_waits,
        "err": ((t.double() - want).abs().max() / want.abs().max()).item(),
        "sha": hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest(),
    }


def main(outdir, algorithms, sizes):
    comm = init_with("cuda_ipc", StandInDevice(seed=RANK), timeout=120, stall_s=0,
                     abort_on_error=False)  # fmt: skip
    report = {}
    for algorithm in algorithms.split(","):
        for nbytes in map(int, sizes.split(",")):
            for dtype in (torch.float32, torch.bfloat16):
                key = f"{algorithm} {nbytes} {str(dtype).split('.')[1]}"
                report[key] = case(comm, algorithm, nbytes, dtype)
    report["ran on"] = f"{comm.transport.name} {comm.device.type}"
    comm.close()
    with open(os.path.join(outdir, f"rank{RANK}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
