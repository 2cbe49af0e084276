"""DDP step time over the "commrt" backend against gloo, alternated step by step::

    mpiexec -n 2 python bench/ddp_alternating.py [STEPS]

The ~25M-parameter MLP of bench_gradsync.py (100 MB of fp32 gradients, four
25 MB DDP buckets) trains under four variants in the same processes:
``local`` (the model alone: forward, backward, SGD, no DDP and no
communication: the compute floor), ``commrt`` (DDP on the default commrt
group: MPI under mpiexec, COMMRT_ALGORITHM or auto), ``commrt_gloo`` (a
commrt group over its gloo transport: what bench_torch_backend.py measured
before the world group went over MPI whatever ``init_process_group`` was
given), ``gloo`` (DDP on a gloo group of the same ranks) and ``ddp_nocomm``
(DDP whose communication hook hands each bucket back untouched: DDP's own
cost, its bucket copies and reducer, without any transfer: the floor for
every backend, higher than ``local``). Each round runs
one step of each, in an order that flips every round, after a gloo barrier,
so that a shared machine's load falls on all of them alike
(bench_torch_backend.py runs them one after the other). Rank 0 prints the median wall time per step with the quartiles,
the median CPU time of the process (all its threads) per step, and the
ratios to gloo. Goal (issue 22): commrt ≤ 0.8× gloo at 2 ranks.
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gradsync import IN, OUT, _mlp  # noqa: E402
from bench_torch_backend import init_commrt_over_mpi  # noqa: E402

from commrt.distributed import Options  # noqa: E402

VARIANTS = ("local", "ddp_nocomm", "commrt", "commrt_gloo", "gloo")


def _no_communication(state, bucket):
    """A DDP communication hook that communicates nothing (the ``ddp_nocomm`` floor)."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _stepper(variant, groups):
    model = _mlp()
    net = model if variant == "local" else DDP(model, process_group=groups[variant])
    if variant == "ddp_nocomm":
        net.register_comm_hook(None, _no_communication)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    x, y = torch.randn(64, IN), torch.randint(0, OUT, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        loss_fn(net(x), y).backward()
        opt.step()
        opt.zero_grad()

    return step


def main(steps: int) -> None:
    gloo = init_commrt_over_mpi()
    # what the benchmark measured before the world group went over MPI: commrt over gloo
    cg = dist.new_group(backend="commrt", pg_options=Options(cpu_transport="gloo"))
    groups = {"commrt": None, "commrt_gloo": cg, "gloo": gloo, "ddp_nocomm": None}
    run = {v: _stepper(v, groups) for v in VARIANTS}
    wall = {v: [] for v in VARIANTS}
    cpu = {v: [] for v in VARIANTS}
    for v in VARIANTS:  # warm-up (DDP rebuilds its buckets after the first step)
        run[v]()
        run[v]()
    for i in range(steps):
        for v in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            dist.barrier(group=gloo)
            c0, t0 = time.process_time(), time.perf_counter()
            run[v]()
            wall[v].append(time.perf_counter() - t0)
            cpu[v].append(time.process_time() - c0)
    if dist.get_rank() == 0:
        ref = statistics.median(wall["gloo"])
        print(f"{dist.get_world_size()} ranks, {steps} rounds, load {os.getloadavg()[0]:.1f}")
        for v in VARIANTS:
            w = sorted(wall[v])
            q1, med, q3 = statistics.quantiles(w, n=4)
            print(
                f"{v:>11}: median {med * 1e3:7.1f} ms (IQR {q1 * 1e3:.1f}-{q3 * 1e3:.1f}, "
                f"min {w[0] * 1e3:.1f}), cpu {statistics.median(cpu[v]) * 1e3:6.1f} ms, "
                f"{med / ref:.2f}x gloo"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
