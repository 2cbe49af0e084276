"""The probe's timing of schedules, and the per-step overheads it measures on CPU backends.

Why overheads
-------------
On ranks that share a few cores (more ranks than cores, gloo over TCP),
a step of a small all-reduce costs each rank CPU time, not wire time, and
that time overlaps the wire: a larger step takes its wire time alone, not
the overhead plus the wire that ``α + β·n`` adds. And it depends on the
step's kind: an exchange with one peer costs more than a ring shift, and
a step with several messages (a pipelined torus's segments) more again.
The probe's 8 B shift, timed back to back, gives the cost of neither. So
:func:`measure_overheads` times the steps the schedules really run and
gives a :class:`commrt.sim.Overhead`, with which the replay prices a
message ``max(β·load, overhead)``.

What it runs
------------
At :data:`CALIBRATION_BYTES` (32 KiB: little enough that no wire binds,
enough to pay what a real bucket's step pays, which tiny calls do not)
the real all-reduce schedules of

* recursive doubling (p a power of two): exchange steps only → ``exchange_s``;
* the ring (p > 2): shift steps only → ``shift_s``;
* the 2-row torus in 16 pipelined segments with ring columns (p even, ≥ 4):
  several messages a step → ``multi_s``,

each one warm-up call, then ``repeats`` barrier-aligned runs of about 40
steps' worth of back-to-back calls (one call right after a barrier finds
every rank awake, and times far less than the same call among a training
loop's calls) through the communicator's own executor. A call's time is agreed as the probe agrees its steps (the median
over runs of the slowest rank's, one gather). Then
each overhead, in that order, is solved for: the value at which the replay
of that schedule on the probed network (its β, γ and tiers) takes the
measured time (bisection; the replay's time only grows with it). A kind
with nothing to measure takes its neighbour's value: p = 2 has only
exchanges (``shift_s = exchange_s``), p not a power of two no pure
exchange schedule (``exchange_s = shift_s``), p without a 2-row grid no
pipelined torus (``multi_s = exchange_s``: no candidate has such steps).

Only where ranks span nodes, and not on GPUs. On one node the "wire" is
the cores themselves (shared-memory copies), so a step's overhead adds to
it instead of hiding under it, and ``max(wire, overhead)`` would price
schedules that differ as equal (``α + β·n`` tells them apart there).
NCCL's steps are kernel launches on their own streams, and its α adds to
the wire as the closed forms say. Cost: 6 × 40 steps of each of 3 small
all-reduces.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from commrt.schedule import Schedule
from commrt.sim import Network, Overhead, simulate

__all__ = [
    "CALIBRATION_BYTES",
    "agreed",
    "time_runs",
    "calibration_schedules",
    "calibration_times",
    "fit_overheads",
]

#: the all-reduce size the overheads are timed at
CALIBRATION_BYTES = 32 << 10
# Steps per timed run: one short call right after a barrier finds every rank awake and
# times far less than the same call among a training loop's calls.
_RUN_STEPS = 40
_SEGMENTS = 16  # most of its steps have several messages: the kind it measures


def time_runs(
    comm, sched: Schedule, buf: torch.Tensor, repeats: int, calls: int = 1
) -> list[float]:
    """Seconds per step of each of ``repeats`` barrier-aligned runs of ``calls`` back-to-back
    calls of ``sched`` (after one warm-up call), all on one binding to ``buf``, kept while
    ``buf`` lives."""
    run = comm.run_schedule  # as commrt.all_reduce runs, so α is the latency it sees
    # bound once and kept (``buf`` owns it), as a caller's repeated calls are: bound afresh
    # each run, an 8 B step over shm timed 70 µs at p = 2 where a kept one took 6
    run(sched, buf, owner=buf)  # warm-up: plan, binding, scratch, connections
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            run(sched, buf, owner=buf)
        times.append((time.perf_counter() - t0) / (calls * sched.num_steps))
    return times


def agreed(runs: np.ndarray) -> list[float]:
    """Per size: the median over runs of the slowest rank's time. A synchronous step goes at
    the slowest rank's pace; the median, not the minimum, since a schedule meets the
    machine's bursts as often as the probe does (and the mean would follow one burst)."""
    return np.median(runs.max(axis=0), axis=-1).tolist()


def calibration_schedules(p: int) -> dict[str, Schedule]:
    """``{kind: schedule}`` timed for each overhead that ``p`` ranks can show (module doc)."""
    # lazy: the algorithms package imports the probe through Auto
    from commrt.algorithms.pipelined_torus import PipelinedTorus2D
    from commrt.algorithms.recursive_doubling import RecursiveDoubling
    from commrt.algorithms.ring import Ring

    out = {}
    if p > 1 and p & (p - 1) == 0:
        out["exchange"] = RecursiveDoubling().select(p, CALIBRATION_BYTES)
    if p > 2:
        out["shift"] = Ring().select(p, CALIBRATION_BYTES)
    if p >= 4 and p % 2 == 0:
        pipe = PipelinedTorus2D(2, p // 2, _SEGMENTS, False)
        out["multi"] = pipe.select(p, CALIBRATION_BYTES)
    return out


def _solve(time_at, target: float) -> float:
    """The overhead c ≥ 0 at which the replay ``time_at(c)`` reaches ``target`` seconds."""
    if time_at(0.0) >= target:
        return 0.0
    lo, hi = 0.0, target
    for _ in range(40):  # 2^-40 of the call's time: far below the noise
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if time_at(mid) < target else (lo, mid)
    return (lo + hi) / 2


def fit_overheads(times: dict[str, float], scheds: dict[str, Schedule], net: Network) -> Overhead:
    """The :class:`Overhead` under which the replay on ``net`` gives each ``times[kind]``
    (seconds per call of ``scheds[kind]`` at :data:`CALIBRATION_BYTES`; module doc)."""

    def replay(kind: str, over: Overhead) -> float:
        on = dataclasses.replace(net, overhead=over)
        return simulate(scheds[kind], None, CALIBRATION_BYTES, on).time_s

    ex = sh = None
    if "exchange" in times:
        ex = _solve(lambda c: replay("exchange", Overhead(c, c, c)), times["exchange"])
    if "shift" in times:
        sh = _solve(
            lambda c: replay("shift", Overhead(c, c if ex is None else ex, c)), times["shift"]
        )
    sh = ex if sh is None else sh
    ex = sh if ex is None else ex
    if sh is None:  # one rank: nothing to measure
        return Overhead(0.0, 0.0, 0.0)
    multi = ex
    if "multi" in times:
        multi = _solve(lambda c: replay("multi", Overhead(sh, ex, c)), times["multi"])
    return Overhead(sh, ex, multi)


def calibration_times(comm, repeats: int) -> tuple[dict[str, Schedule], dict[str, float]]:
    """Time the calibration schedules on ``comm``: ``({kind: schedule}, {kind: seconds per
    call})``, agreed on every rank (collective; module doc)."""
    from commrt.runtime.rows import gather

    scheds = calibration_schedules(comm.world_size)
    buf = torch.zeros(CALIBRATION_BYTES // 4, dtype=torch.float32, device=comm.device)
    mine = [
        t * s.num_steps
        for s in scheds.values()
        for t in time_runs(comm, s, buf, repeats, max(1, _RUN_STEPS // s.num_steps))
    ]
    table = np.asarray(gather(comm, mine), dtype=np.float64)
    runs = table.reshape(len(table), len(scheds), repeats)
    return scheds, dict(zip(scheds, agreed(runs)))


def measure_overheads(comm, net: Network, repeats: int) -> Overhead:
    """Time the calibration schedules on ``comm`` and fit (collective; module doc)."""
    scheds, times = calibration_times(comm, repeats)
    return fit_overheads(times, scheds, net)
