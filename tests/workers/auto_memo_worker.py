"""Run under mpiexec: ``auto``'s learning runs its phases' calls through the memo.

argv: out.json. Every rank all-reduces one 4 KiB tensor, refilled in place (a
gradient bucket's pattern: a repeat of the last call), with an Auto priced on
a network a thousand times too fast, so that the baseline misses and a trial
runs, until the size has settled. Every call of the model's choice sleeps
2 ms, on the memo's path and the full one alike: the trial must time the
calls the memo ran to see it. Per call each rank notes the phase and the
label it ran, and whether the memo ran it (no ``select``: only the full path
asks). Rank 0 writes every rank's
calls and state.
"""

import os
import sys
import time

import torch
from mpi4py import MPI
from mpi_report import write_ranks

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import commrt  # noqa: E402
from commrt.algorithms import Auto  # noqa: E402
from commrt.algorithms.auto import candidates, learning  # noqa: E402
from commrt.algorithms.auto_learn import calls_to_settle  # noqa: E402
from commrt.sim import Network  # noqa: E402
from commrt.tuning.memory import AutoMemory  # noqa: E402

N = 1024  # floats: 4 KiB
SLOW_S = 0.002
selects = []  # this call's select() calls


class CountingAuto(Auto):
    """``auto``, noting each ``select`` (the full path's; the memo's path has none)."""

    def select(self, world_size, nbytes, comm=None):
        selects.append(nbytes)
        return super().select(world_size, nbytes, comm)


MAX_CALLS = calls_to_settle(len(candidates(MPI.COMM_WORLD.Get_size()))) + 10


def main(out_path):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    comm = commrt.init("mpi", timeout=60)
    comm.slots.auto_memory = AutoMemory({}, None, writes=False)  # a first job
    auto = CountingAuto(
        network=Network.flat(alpha_s=20e-9, beta_s_per_byte=1 / 5e12), recheck_s=None
    )
    model = auto.choose(p, 4 * N).label
    executor = comm.executor
    run, repeat = executor.run, executor.repeat

    def slow_run(schedule, *a, **k):
        if schedule.name == f"auto:{model}":
            time.sleep(SLOW_S)
        return run(schedule, *a, **k)

    def slow_repeat(memo, *a, **k):
        if memo.schedule.name == f"auto:{model}":
            time.sleep(SLOW_S)
        return repeat(memo, *a, **k)

    executor.run, executor.repeat = slow_run, slow_repeat
    x = torch.empty(N)
    calls, failures = [], []
    for i in range(MAX_CALLS):
        t = learning(comm).get(4 * N)
        phase, label = ("first", model) if t is None else (t.phase, t.running)
        x.fill_(float(rank + 1))
        selects.clear()
        commrt.all_reduce(x, comm, algorithm=auto, op="sum")
        if not torch.equal(x, torch.full((N,), p * (p + 1) / 2)):
            failures.append({"call": i, "got": x[:3].tolist()})
        calls.append([phase, label, not selects])
        if learning(comm)[4 * N].phase == "settled":
            break
    t = learning(comm)[4 * N]
    mine = {
        "rank": rank,
        "model": model,
        "kept": t.kept,
        "trial_s": t.trial_s,
        "calls": calls,
        "failures": failures,
    }
    write_ranks(world, comm, out_path, mine)


if __name__ == "__main__":
    main(sys.argv[1])
