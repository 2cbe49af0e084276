"""Two ranks call a collective with different arguments, without COMMRT_DEBUG.

    mismatch_worker.py BACKEND CASE

Cases: ``size`` (all_reduce of 1024 vs 1000 elements), ``shape`` (all_reduce of
(4, 8) vs (8, 4): equal element counts), ``broadcast`` (broadcast of 1024 vs
1000 elements). Every rank first makes one matching call, then the mismatched
one; it prints ``rank R raised after S s: MESSAGE`` if that raises commrt's
CollectiveMismatchError (or ``rank R: no error``), then makes a matching call
again to show the communicator still works (``rank R still works: SUM``).
"""

import sys
import time

import torch

import commrt
from commrt.errors import CollectiveMismatchError

SHAPES = {"size": ((1024,), (1000,)), "shape": ((4, 8), (8, 4)), "broadcast": ((1024,), (1000,))}


def main(backend: str, case: str) -> int:
    comm = commrt.init(backend, timeout=60)
    commrt.all_reduce(torch.ones(4), comm, op="sum")
    t = torch.ones(SHAPES[case][comm.rank % 2])
    t0 = time.monotonic()
    try:
        if case == "broadcast":
            commrt.broadcast(t, comm, root=0)
        else:
            commrt.all_reduce(t, comm, op="sum")
    except CollectiveMismatchError as e:
        # one write per line, so that mpiexec does not interleave the ranks' lines
        sys.stdout.write(f"rank {comm.rank} raised after {time.monotonic() - t0:.3f} s: {e}\n")
    else:
        sys.stdout.write(f"rank {comm.rank}: no error\n")
    sys.stdout.flush()
    ok = commrt.all_reduce(torch.ones(3), comm, op="sum")
    sys.stdout.write(f"rank {comm.rank} still works: {ok.sum().item():g}\n")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
