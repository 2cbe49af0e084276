"""8-byte all-reduce: commrt (``algorithm="auto"``) against mpi4py's ``Allreduce`` on a numpy
buffer, interleaved in one run (issue 25's small-message goal: at most 3x)::

    mpiexec -n 2 python bench/allreduce_small_vs_mpi.py

Rank 0 prints the two medians over 9 rounds of 3000 calls each, their ratio and each round's.
"""

import statistics
import time

import numpy as np
import torch
from mpi4py import MPI

import commrt

ROUNDS, CALLS = 9, 3000


def main() -> None:
    comm = commrt.init("mpi", timeout=60)
    world = MPI.COMM_WORLD
    x, a = torch.ones(2), np.ones(2, dtype=np.float32)

    def per_call(fn, n):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    def ours():
        commrt.all_reduce(x, comm, algorithm="auto", op="sum")

    def native():
        world.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

    per_call(ours, 2000), per_call(native, 2000)  # warm-up
    mine, theirs = [], []
    for _ in range(ROUNDS):
        world.Barrier()
        mine.append(per_call(ours, CALLS))
        world.Barrier()
        theirs.append(per_call(native, CALLS))
    if comm.rank == 0:
        c, m = statistics.median(mine), statistics.median(theirs)
        rounds = " ".join(f"{p / q:.1f}" for p, q in zip(mine, theirs))
        print(f"8 B: commrt {c * 1e6:.2f} us, MPI_Allreduce {m * 1e6:.2f} us, {c / m:.2f}x")
        print(f"per round: {rounds}")
    comm.close()


if __name__ == "__main__":
    main()
