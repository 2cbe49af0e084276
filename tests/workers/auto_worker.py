"""Run under mpiexec: commrt.all_reduce(algorithm="auto") vs MPI Allreduce.

Checks that the result equals MPI's, that every rank made the same choices
(schedule names and predicted times), that the probe ran once and is cached
on the communicator, and that the choice names the trace spans. Rank 0
writes a JSON report to argv[1].
"""

import os
import sys

import torch
from mpi4py import MPI
from mpi_report import write_ranks

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import commrt  # noqa: E402
from commrt.algorithms.auto import choices  # noqa: E402
from commrt.runtime.trace import Tracer  # noqa: E402

SIZES = [1, 1000, 1_000_003]


def main(out_path):
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    comm = commrt.init("mpi", timeout=60)
    tracer = Tracer(rank=rank)
    failures, probes = [], []
    for n in SIZES:
        g = torch.Generator().manual_seed(100 + 7 * rank + n)
        x = torch.randn(n, generator=g)
        ref = x.clone()
        world.Allreduce(MPI.IN_PLACE, ref.numpy(), op=MPI.SUM)
        mag = x.abs()
        world.Allreduce(MPI.IN_PLACE, mag.numpy(), op=MPI.SUM)
        t = x.clone()
        commrt.all_reduce(t, comm, algorithm="auto", op="sum", tracer=tracer)
        excess = ((t - ref).abs() - 2e-6 * mag).max().item()
        if excess > 0:
            failures.append({"rank": rank, "n": n, "excess": excess})
        probes.append(id(comm.slots.probe))
    # same size again: a cached choice, no new probe
    t = torch.ones(1000)
    commrt.all_reduce(t, comm, algorithm="auto", op="avg")
    if not torch.equal(t, torch.ones(1000)):
        failures.append({"rank": rank, "avg_of_ones": t[:4].tolist()})
    probes.append(id(comm.slots.probe))
    probe = comm.slots.probe
    made = {
        str(nb): [c.label, c.schedule.name, c.predicted_s, [list(x) for x in c.candidates]]
        for nb, c in sorted(choices(comm).items())
    }
    spans = sorted(
        {e["name"].split("/step")[0] for e in tracer.events if e["name"].startswith("commrt/")}
    )
    mine = {
        "rank": rank,
        "choices": made,
        "probe": [probe.alpha_s, probe.beta_s_per_byte],
        "overhead": [probe.shift_s, probe.exchange_s, probe.multi_s],
        "priced_with": [repr(c.network.overhead) for c in choices(comm).values()],
        "probe_cached_once": len(set(probes)) == 1 and probes[0] != id(None),
        "probe_seconds": probe.seconds,
        "probe_step_s": list(probe.step_s),
        "per_rank": [list(r) for r in probe.per_rank],
        "spans": spans,
        "failures": failures,
    }
    write_ranks(world, comm, out_path, mine)


if __name__ == "__main__":
    main(sys.argv[1])
