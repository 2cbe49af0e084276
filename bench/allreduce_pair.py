"""Median all-reduce time over MPI at 8 B and 32 MiB (ring and auto), for before/after
comparisons of two checkouts in one sitting. Run with each checkout's python, alternating::

    for i in 1 2 3; do for tree in OLD NEW; do
        mpiexec -n 2 $tree/.venv/bin/python bench/allreduce_pair.py; done; done

Rank 0 prints one line: ``RESULT {"8B ring": seconds, ...}``.
"""

import json
import statistics
import time

import commrt
from commrt.cli.bench import timing_buffer

CASES = (("8B", 8, 2000), ("32MiB", 32 << 20, 5))  # (label, bytes, calls per timed round)


def main(rounds: int = 7) -> None:
    comm = commrt.init("mpi", timeout=120)
    out = {}
    for label, nbytes, iters in CASES:
        for alg in ("ring", "auto"):
            x = timing_buffer(nbytes // 4)
            for _ in range(3):
                commrt.all_reduce(x, comm, algorithm=alg, op="sum")
            times = []
            for _ in range(rounds):
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    commrt.all_reduce(x, comm, algorithm=alg, op="sum")
                times.append((time.perf_counter() - t0) / iters)
            out[f"{label} {alg}"] = statistics.median(times)
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
