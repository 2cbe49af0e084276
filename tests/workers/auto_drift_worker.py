"""Run under mpiexec: ``auto`` notices when the schedule it kept slows down, and moves on.

argv: out.json, "debug" or "memo". Every rank runs 4 KiB all-reduces with
``Auto(recheck_s=0.05)`` until the size has settled. Then every call of the
kept schedule sleeps 20 ms (the machine changed under it), and the ranks go
on calling until ``auto`` has kept another schedule. With "memo" the settled
calls run through ``commrt.all_reduce``'s memo (the watch must have it
dropped for the recheck); with "debug" (``COMMRT_DEBUG``) every call goes
through ``observe``. Rank 0 writes every rank's state and results.
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
from commrt.algorithms.auto import candidates, choices, learning  # noqa: E402
from commrt.algorithms.auto_learn import calls_to_settle  # noqa: E402
from commrt.collectives.memo import last_settled  # noqa: E402

N = 1024  # floats: 4 KiB
#: reached only if learning never settles or never moves on: settling, a recheck, and
#: settling again, each within calls_to_settle
MAX_CALLS = 2 * calls_to_settle(len(candidates(4))) + 100


def main(out_path, mode):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    comm = commrt.init("mpi", timeout=60, debug=mode == "debug")
    auto = Auto(recheck_s=0.05)
    slow = []  # the label whose calls sleep, once set
    run = comm.executor.run

    def maybe_slow(schedule, *a, **k):
        if slow and schedule.name == f"auto:{slow[0]}":
            time.sleep(0.02)
        return run(schedule, *a, **k)

    comm.executor.run = maybe_slow
    failures, first, memo_seen, phases = [], None, 0, []
    for i in range(MAX_CALLS):
        x = torch.full((N,), float(rank + 1))
        commrt.all_reduce(x, comm, algorithm=auto, op="sum")
        if not torch.equal(x, torch.full((N,), p * (p + 1) / 2)):
            failures.append({"call": i, "got": x[:3].tolist()})
        t = learning(comm)[4 * N]
        memo_seen += last_settled(comm) is not None
        if not phases or phases[-1] != t.phase:
            phases.append(t.phase)
        if first is None and t.phase == "settled":
            first = t.kept
            slow.append(first)
        elif first is not None and t.phase == "settled" and t.kept != first:
            break
    c = choices(comm)[4 * N]
    mine = {
        "rank": rank,
        "calls": i + 1,
        "first": first,
        "kept": t.kept,
        "choice": [c.label, c.learned, t.choice],
        "phases": phases,
        "memo_seen": memo_seen,
        "recheck_s": t.recheck_s,
        "trial_s": t.trial_s,
        "failures": failures,
    }
    write_ranks(world, comm, out_path, mine)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
