"""Wall and CPU time of one 25 MB all-reduce, commrt (MPI under mpiexec) against gloo::

    mpiexec -n 2 python bench/allreduce_cpu_alternating.py [ROUNDS]

The DDP step's bucket size, alternated call by call after a gloo barrier.
CPU time is the process's (all threads, kernel time included: gloo's
loopback TCP copies are kernel time). On a machine with fewer free cores
than busy threads a DDP step's wall time follows its CPU time, so this,
not the wall time of a lone all-reduce, is what commrt can save inside a
DDP step (issue 22; bench/ddp_alternating.py).
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_backend import init_commrt_over_mpi  # noqa: E402


def main(rounds: int) -> None:
    gloo = init_commrt_over_mpi()
    t = torch.randn(25 * 2**20 // 4)
    groups = {"commrt": None, "gloo": gloo}
    for g in groups.values():  # warm-up: connections, persistent requests, auto's choice
        dist.all_reduce(t, group=g)
        dist.all_reduce(t, group=g)
    wall = {k: [] for k in groups}
    cpu = {k: [] for k in groups}
    for i in range(rounds):
        for k in groups if i % 2 == 0 else list(groups)[::-1]:
            dist.barrier(group=gloo)
            c0, t0 = time.process_time(), time.perf_counter()
            dist.all_reduce(t, group=groups[k])
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks, {rounds} rounds, load {os.getloadavg()[0]:.1f}")
        for k in groups:
            q1, med, q3 = statistics.quantiles(wall[k], n=4)
            c1, cmed, c3 = statistics.quantiles(cpu[k], n=4)
            print(
                f"{k:>6}: wall {med * 1e3:.1f} ms (IQR {q1 * 1e3:.1f}-{q3 * 1e3:.1f}), "
                f"cpu {cmed * 1e3:.1f} ms (IQR {c1 * 1e3:.1f}-{c3 * 1e3:.1f})"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
