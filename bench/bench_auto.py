"""``auto`` against the best fixed algorithm: what choosing costs, settled and while it learns.

From the repository root, on 2 and 4 ranks (every rank runs it; rank 0 prints)::

    mpiexec -n 2 python bench/bench_auto.py              # shm, mpi, gloo; 8 B .. 16 MiB
    mpiexec -n 4 python bench/bench_auto.py --transports shm --sizes 8,64K --rounds 3

Per transport and size, in rounds that alternate the sides (every other round in reverse
order, so that a drift in the machine's load meets all alike):

* every fixed candidate ``auto`` chooses among (:func:`commrt.algorithms.auto.candidates`):
  a warm-up call, then ``iters`` calls back to back (``commrt bench allreduce``'s count), or
  as many more as take :data:`MIN_ROUND_S` (see there);
* ``auto`` settled: the same, once it has settled for the size (it learns first, untimed);
* ``auto`` as a user's first calls see it: everything ``auto`` learned on the communicator
  forgotten (the probe too) before each round, then a warm-up call (which probes, as the
  warm-up of ``commrt bench allreduce`` does) and ``5 × iters`` calls, exploration included;
  with no memory of earlier jobs (:mod:`commrt.tuning.memory`): a first job's;
* ``auto`` as a second job's first calls see it: the same, but starting from what the
  settled side's job kept in the memory (a file of the bench's own, in a temporary folder,
  whatever ``COMMRT_AUTO_MEMORY`` says), read afresh in the warm-up call.

Each side's figure is the median of its rounds' mean call, never a minimum across noisy
rounds; the best fixed algorithm is the one with the lowest median. ``× best`` is auto's
figure over it. What ``auto`` learns is kept per communicator (so per job, world size and
transport) and per buffer size, in ``comm.slots``, and each verdict in the memory file too:
every round of the first calls forgets both, so it starts as a first job does; every round
of the second job's forgets the first only.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import tempfile
import time

import torch

import commrt
from commrt import settings
from commrt.algorithms import Auto
from commrt.algorithms.auto import candidates, label
from commrt.algorithms.auto_learn import calls_to_settle
from commrt.cli.bench import DEFAULT_SIZES, default_iterations, timing_buffer
from commrt.cli.units import fmt_bytes, size_list
from commrt.tuning.memory import AutoMemory

#: calls of the first-calls figure: a user's ``--repeats 5`` runs of ``--iters`` calls
FIRST_RUNS = 5
#: a round of a fixed algorithm or of settled ``auto`` takes at least this long: over gloo on
#: 2 cores whole stretches of ~10 ms ran 2-4x slower, and 50 calls of 0.4 ms are 20 ms, so
#: the same schedule measured 1.8x apart in two sides' rounds; in 0.2 s rounds, 1.02-1.13x
MIN_ROUND_S = 0.2


def _round(comm, call, calls: int) -> float:
    """Mean seconds a call of ``calls`` back-to-back calls of ``call`` (after a barrier)."""
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) / calls


def _forget(comm, auto: Auto) -> None:
    """Drop everything ``auto`` learned on ``comm`` (its choices, trials, the memos of
    settled calls, the executor's of the last) and the probe: the next call starts as a new
    job's first call does."""
    slots = comm.slots
    for store in (slots.auto_choices, slots.auto_tuning, slots.auto_tried):
        # equal Autos share their entries (a frozen dataclass's key): forget those too
        for key in [k for k in store if k[0] == auto]:
            del store[key]
    comm.executor.settled.clear()  # and the executor's memo of the last
    slots.auto_remembered.clear()
    slots.probe = None
    slots.auto_memory = None  # read again, at the next call's select


def measure(comm, nbytes: int, rounds: int) -> dict:
    """The medians (seconds a call) of every side at ``nbytes``, and what auto kept."""
    x = timing_buffer(max(1, nbytes // 4))
    iters = default_iterations(nbytes)
    # three instances: three learning states
    settled, first, second = Auto(), Auto(recheck_s=None), Auto(recheck_s=None)
    fixed = {label(a): a for a in candidates(comm.world_size)}

    def run(alg):
        return lambda: commrt.all_reduce(x, comm, algorithm=alg, op="sum")

    key = (settled, comm.world_size, x.nbytes)
    for _ in range(calls_to_settle(len(fixed))):  # settle first, untimed
        run(settled)()
        if comm.slots.auto_tuning[key].phase == "settled":
            break
    # the settled sides' calls a round: at least MIN_ROUND_S at settled auto's pace (agreed:
    # the slowest rank's count)
    pace = _round(comm, run(settled), iters)
    want = max(iters, math.ceil(MIN_ROUND_S / max(pace, 1e-9)))
    steady = int(commrt.all_reduce(torch.tensor([float(want)]), comm, op="max").item())
    sides = {name: run(a) for name, a in fixed.items()}
    sides["auto settled"] = run(settled)
    learners = {"auto first calls": first, "auto second job": second}
    times = {name: [] for name in [*sides, *learners]}
    for r in range(rounds):
        order = list(times)
        for name in order[:: -1 if r % 2 else 1]:
            if name in learners:
                alg = learners[name]
                _forget(comm, alg)
                if alg is first:  # nothing remembered: a first job
                    comm.slots.auto_memory = AutoMemory({}, None, writes=False)
                run(alg)()  # the warm-up call: it probes (and reads the memory)
                times[name].append(_round(comm, run(alg), FIRST_RUNS * iters))
            else:
                sides[name]()  # warm-up (a memo the first-calls side dropped)
                times[name].append(_round(comm, sides[name], steady))
    # rank 0 prints its own medians (the ranks ran every round together)
    med = {name: statistics.median(t) for name, t in times.items()}
    kept = comm.slots.auto_tuning[key].kept
    return {"median": med, "kept": kept, "iters": iters, "steady": steady, "fixed": list(fixed)}


def table(transport: str, p: int, rows: list[tuple[int, dict]]) -> str:
    head = (
        f"# auto vs the best fixed algorithm · {transport} · {p} ranks · float32 · µs a call\n"
        f"#{'size':>8} {'best fixed':<20}{'µs':>9}{'settled':>9}{'×':>6}"
        f"{'first':>9}{'×':>6}{'second':>9}{'×':>6}  auto kept"
    )
    lines = [head]
    for nbytes, m in rows:
        med = m["median"]
        best = min(m["fixed"], key=lambda n: med[n])
        b, s, f = med[best], med["auto settled"], med["auto first calls"]
        j = med["auto second job"]
        lines.append(
            f" {fmt_bytes(nbytes):>8} {best[:20]:<20}{b * 1e6:9.1f}{s * 1e6:9.1f}{s / b:6.2f}"
            f"{f * 1e6:9.1f}{f / b:6.2f}{j * 1e6:9.1f}{j / b:6.2f}  {m['kept']}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transports", default="shm,mpi,gloo")
    ap.add_argument("--sizes", type=size_list, default=list(DEFAULT_SIZES))
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    args = ap.parse_args(argv)
    # the bench's own memory file: the settled side's verdicts, for the second job's side
    folder = tempfile.mkdtemp(prefix="commrt-bench-auto-")
    os.environ[settings.AUTO_MEMORY.name] = os.path.join(folder, "auto-memory.json")
    torch.set_num_threads(1)
    for transport in args.transports.split(","):
        comm = commrt.init(transport)
        rows = [(n, measure(comm, n, args.rounds)) for n in args.sizes]
        if comm.rank == 0:
            print(table(transport, comm.world_size, rows), flush=True)
        comm.close()
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
