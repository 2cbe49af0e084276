"""How ``algorithm="auto"`` learns from what it runs: one size's baseline, trial and verdict.

The policy
----------
For each buffer size, ``commrt.all_reduce(..., algorithm="auto")`` times the calls it makes
(:meth:`Tuning.record`), in phases of :data:`WINDOW` timed calls after :data:`WARMUP` untimed
ones (the first call of a schedule compiles its plan and allocates scratch):

1. **baseline**: time the model's choice. Its time is agreed across ranks as the median over
   the window of each call's *slowest* rank (a synchronous collective ends when its last rank
   does). If it is within ``MARGIN`` (10%) of its prediction, either way, and the runner-up is
   predicted above :data:`CONTENDERS` × the choice (a loss the model's errors of tens of
   percent cannot undo), the choice stays: **settled**. An earlier job's verdict
   (:mod:`commrt.tuning.memory`) is timed as its trial timed it, a block (below), and stays
   unless it runs over ``MARGIN`` slower than then (:meth:`Tuning._missed`).
2. Else **trial**, in passes. A pass runs each live candidate (the runner-up, every other
   candidate predicted within :data:`CONTENDERS` × the choice, and the choice) in a block of
   back-to-back calls, as the kept one will run (:data:`WARMUP` untimed calls, then enough
   timed ones to fill :data:`BLOCK_S` at the baseline's time a call, from
   :data:`MIN_BLOCK_CALLS` to :data:`MAX_BLOCK_CALLS`), each pass's order rotated by one, and
   one untimed call after its last block (see :meth:`Tuning._lay_out`: with more ranks than
   cores the block just before the gather measured 3-5x slower). A block's time is its
   slowest rank's mean call (:mod:`~commrt.algorithms.auto_times`): the throughput of
   back-to-back calls (a median of single calls favours a schedule whose calls alternate
   fast and slow), less the calls over ``OUTLIER`` × that rank's median, at most a quarter:
   those in which a rank was descheduled (on 2 cores, 7 % of 8 B calls over gloo took 10-15x
   the median). A candidate's time is the median of its blocks, so that one block with more
   such calls than were left out decides nothing either. After each pass (one gather):

   * a candidate that lost to the leader by a wide margin, even its fastest of two blocks or
     more over :data:`WIDE` × the leader's median, is out, and is never tried again for that
     size (one block in which a rank was descheduled puts nothing out: a stall slows a block,
     never speeds one);
   * the trial stops once the answer is clear: one candidate left, or, after
     :data:`TRIAL_PASSES` passes (a median of three discards one stalled block), every other
     one slower than the leader by more than ``MARGIN`` even in its fastest block (a slow
     stretch may slow two of its three blocks); else it goes on, up to
     :data:`TRIAL_PASSES` passes or as many more (up to :data:`MAX_TRIAL_PASSES`) as fit in
     :data:`TRIAL_BUDGET_S` per candidate at the baseline's time a call, and keeps the leader
     (the others are then within the margin of it).

   **Paced**: before the baseline and each pass, what it is expected to cost beyond the
   leader's calls (slower candidates, the learning path's own cost, as the job measured it:
   :mod:`~commrt.algorithms.auto_cost`) is weighed against the
   size's calls so far; where all of it would pass :data:`EXPLORE` of their time, the leader
   first runs alone on the settled path (**hold**), at most :data:`MAX_HOLD` calls. A user's
   first calls cost the model's choice plus at most that share.
3. **verdict**: the leader is kept for that size (``learned=True`` where not the model's),
   run by ``commrt.all_reduce``'s memo (``collectives.memo.SettledCall``): it counts calls.
4. **recheck**: after :data:`RECHECK_S` seconds' worth of the kept schedule's calls (at its
   measured time a call; at least :data:`RECHECK_MIN_CALLS` calls), the next calls are timed
   again, as a trial block. If the kept schedule is now slower than the trial's fastest other
   candidate by more than ``MARGIN`` (one that was out too: it lost to a schedule that has
   slowed since), the two meet again in a fresh trial, and the faster is kept; so do a kept
   schedule and the model's choice it replaced, where that is cheap. One settled without a
   trial is held to its baseline time. Each recheck that keeps the same schedule doubles the
   wait before the next, up to :data:`RECHECK_MAX_S`; a change starts it again.
   ``Auto(recheck_s=None)`` never rechecks.

Every rank decides from the same numbers: a phase's times reach every rank in one small gather
(:func:`commrt.runtime.rows.gather`) at the end of the phase or pass; a hold's length comes
from agreed numbers only. A size settles within :func:`calls_to_settle` calls. :class:`Tuning`
is the pure decision state (tested with injected timings, no processes); :func:`agree` is the
one collective step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from commrt import settings
from commrt.algorithms.auto_cost import LearningCost
from commrt.algorithms.auto_times import agreed_time, block_time
from commrt.algorithms.auto_trial import (
    BLOCK_S,
    MAX_BLOCK_CALLS,
    MAX_HOLD,
    MAX_TRIAL_PASSES,
    MIN_BLOCK_CALLS,
    WIDE,
    TrialPasses,
)

__all__ = [
    "MARGIN",
    "WINDOW",
    "WARMUP",
    "CONTENDERS",
    "TRIAL_PASSES",
    "BLOCK_S",
    "MIN_BLOCK_CALLS",
    "MAX_BLOCK_CALLS",
    "TRIAL_BUDGET_S",
    "MAX_TRIAL_PASSES",
    "RECHECK_S",
    "RECHECK_MAX_S",
    "RECHECK_MIN_CALLS",
    "WIDE",
    "EXPLORE",
    "MAX_HOLD",
    "Tuning",
    "calls_to_settle",
    "agree",
]

#: a choice that measures more than this fraction above its prediction gets its runner-up
#: tried. The goal is to be within 1.1× of the fastest candidate: a choice slower than its
#: prediction by more than that may be beaten by a runner-up predicted only a little slower
MARGIN = 0.1
#: timed calls per phase: enough for a median that one burst of another process cannot move
WINDOW = 5
#: untimed calls at the start of each phase (the plan compiles on a schedule's first call)
WARMUP = 1
#: passes of the trial over the tried candidates and the choice (each rotated by one),
#: at least
TRIAL_PASSES = 3
TRIAL_BUDGET_S = settings.Seconds(
    0.25,
    "a trial takes more passes while a candidate's blocks take at most this long",
    "`auto`'s learning",
    settings.AUTO,
)
#: the trial also runs every candidate predicted within this factor of the choice: where
#: the model errs by tens of percent its order among them says little
CONTENDERS = 1.5
RECHECK_S = settings.Seconds(
    2.0,
    "seconds of a settled size's calls before its kept schedule is timed again; doubling "
    "after each recheck that keeps it",
    "`auto`'s learning",
    settings.AUTO,
)
RECHECK_MAX_S = settings.Seconds(
    64.0, "the longest time between two rechecks", "`auto`'s learning", settings.AUTO
)
#: settled calls between rechecks, at least: a recheck costs one small gather
RECHECK_MIN_CALLS = 50
#: the most that trying slower candidates may add to a size's calls, as a fraction of their
#: time so far (a hold of the leader comes first where a pass would pass it)
EXPLORE = 0.05


@dataclass
class Tuning(TrialPasses):
    """What ``auto`` has learned for one (Auto, world size, buffer size).

    ``predicted_s``: the model's time for its choice; ``runner_up``: the
    label of the model's second choice (None: nothing to try), predicted at
    ``runner_predicted_s``; ``others``: further candidates the trial runs
    beside it (those predicted within :data:`CONTENDERS` × the choice);
    ``predicted``: the model's seconds per label (those it priced).
    ``remembered``: ``predicted_s`` is an earlier job's measured time of
    ``choice`` (:mod:`commrt.tuning.memory`), in a trial block's statistic.
    ``phase`` is ``"baseline"``, ``"hold"``, ``"trial"``, ``"settled"`` or
    ``"recheck"``; ``kept`` the label kept once settled; ``chosen_s`` the
    choice's agreed time in the baseline (``chosen_block_s``: the same calls
    as a trial block, :func:`block_time`), ``trial_s`` every tried label's
    median block, ``lost`` the labels out of the trial (by how many times
    the leader's time), ``live`` the current trial's candidates.
    """

    choice: str
    predicted_s: float
    runner_up: str | None
    runner_predicted_s: float | None = None  # None: not priced (left out as a sure loser)
    others: tuple[str, ...] = ()
    predicted: dict = field(default_factory=dict)
    margin: float = MARGIN
    window: int = WINDOW
    warmup: int = WARMUP
    passes: int = TRIAL_PASSES  # the trial's passes, at least (see trial_passes)
    block: int | None = None  # a trial block's timed calls (None: see block_calls)
    budget_s: float = TRIAL_BUDGET_S
    explore: float = EXPLORE
    remembered: bool = False
    #: what learning costs beyond settled calls, as measured (auto_cost)
    cost: LearningCost = field(default_factory=LearningCost)
    phase: str = "baseline"
    kept: str | None = None
    chosen_s: float | None = None
    chosen_block_s: float | None = None
    trial_s: dict = field(default_factory=dict)
    #: every tried label's block times (the slowest rank's mean call)
    samples: dict = field(default_factory=dict)
    lost: dict = field(default_factory=dict)
    live: tuple = ()
    #: passes run in the current trial; the current pass's calls as (label, timed)
    passes_run: int = 0
    plan: tuple = ()
    #: agreed seconds of this size's calls so far (untimed ones at their block's time), and
    #: of them the excess of the blocks slower than their pass's fastest and what learning
    #: cost (:attr:`cost`); calls held before the baseline
    elapsed_s: float = 0.0
    explored_s: float = 0.0
    held: int = 0
    #: this rank's seconds in the current phase, and the calls made in it (timed or not)
    times: list = field(default_factory=list)
    calls: int = 0
    #: seconds of settled calls before the first recheck (None: never recheck); rechecks
    #: in a row that found the kept schedule still the fastest (each doubles the wait);
    #: settled (or held) calls left before the next recheck (or pass); the kept schedule's
    #: time at the last recheck
    recheck_after_s: float | None = RECHECK_S
    confirmed: int = 0
    until_recheck: int = 0
    recheck_s: float | None = None

    def __post_init__(self):
        # even the baseline is paced: where calls are cheap, the model's choice runs alone
        # (as a hold, on the settled path) until the calls can pay for timing it
        if self.phase == "baseline" and self.explore < math.inf and self.predicted_s > 0:
            cost = self.cost.phase(self.warmup + self.window)
            self.held = min(MAX_HOLD, math.ceil(cost / self.explore / self.predicted_s) - 1)
            if self.held > 0:
                self.phase, self.until_recheck = "hold", self.held

    @property
    def rotation(self) -> tuple[str, ...]:
        """The trial's candidates in their first pass's order: the runner-up, the others,
        then the choice; those out (:attr:`lost`) left out."""
        return tuple(x for x in (self.runner_up, *self.others, self.choice) if x not in self.lost)

    def trial_plan(self) -> tuple[tuple[str, bool], ...]:
        """The current pass's calls in order, as ``(label, timed)``: a block of back-to-back
        calls for each live candidate, its first :attr:`warmup` untimed."""
        return self.plan

    @property
    def leader(self) -> str:
        """The fastest candidate measured so far (the model's choice before any trial)."""
        order = (self.choice, self.runner_up, *self.others)
        among = self.live or self.trial_s  # in a trial, its live candidates only
        pool = [x for x in among if x in self.trial_s and x not in self.lost]
        if not pool:
            return self.kept or self.choice
        return min(pool, key=lambda x: (self.trial_s[x], order.index(x)))

    @property
    def running(self) -> str:
        """The label of the candidate the next call runs (in the trial, as
        :meth:`trial_plan` lays the calls out; in a hold, the leader)."""
        if self.phase == "trial":
            return self.plan[self.calls][0]
        if self.phase == "hold":
            return self.leader
        return self.kept or self.choice

    @property
    def learning(self) -> bool:
        """Whether this size has not settled yet (its first baseline, hold or trial)."""
        return self.kept is None

    #: whether calls run on the settled path, counted and not timed (settled, or held)
    on_settled_path = property(lambda self: self.phase in ("settled", "hold"))

    runner_s = property(lambda self: self.trial_s.get(self.runner_up))
    beside_s = property(lambda self: self.trial_s.get(self.choice))

    @property
    def timing(self) -> bool:
        """Whether the next call is timed (the caller synchronises a GPU only then)."""
        if self.phase == "trial":
            return self.plan[self.calls][1]
        return self.phase in ("baseline", "recheck") and self.calls >= self.warmup

    def settled_call(self) -> bool:
        """Count one call of the settled (or held) schedule (every rank counts the same
        calls); True when it was the last before a recheck or the hold's end: the caller
        must then bring the next calls back to :meth:`record` (``commrt.collectives.memo``
        drops its memo of the call)."""
        if self.phase == "hold":
            self.until_recheck -= 1
            if self.until_recheck > 0:
                return False
            if self.chosen_s is None:  # the hold before the baseline
                self.phase, self.times, self.calls = "baseline", [], 0
            else:
                self.phase, self.plan = "trial", self._lay_out()
            return True
        if self.phase != "settled" or self.recheck_after_s is None:
            return False
        self.until_recheck -= 1
        if self.until_recheck > 0:
            return False
        self.phase, self.times, self.calls = "recheck", [], 0
        return True

    def record(self, seconds: float) -> bool:
        """Note one call's time on this rank; True when the phase's window is full (then
        every rank calls :meth:`advance` with every rank's times, in the same call)."""
        if self.on_settled_path:
            return False
        timed = self.timing
        self.calls += 1
        if timed:
            self.times.append(float(seconds))
        if self.phase == "trial":  # a pass ends with an untimed call (see _lay_out)
            return self.calls >= len(self.plan)
        return timed and len(self.times) >= self.window

    def advance(self, table, costs=None) -> None:
        """End the phase with every rank's times (``table``: one row per rank, the same on
        every rank): the choice's, or in a trial pass every live candidate's as
        :meth:`trial_plan` laid them out, a sample per block; ``costs``: every rank's
        :meth:`~commrt.algorithms.auto_cost.LearningCost.columns` (None: not measured)."""
        # a trial's calls run several schedules: only its gather is measured
        calls = 0 if self.phase == "trial" else self.calls
        self.times, self.calls = [], 0
        cost = self.cost.read(costs, calls)
        if self.phase == "baseline":
            self.chosen_s, self.chosen_block_s = agreed_time(table), block_time(table)
            self.elapsed_s += self._held_s() * self.held + self.chosen_s * (
                self.warmup + self.window
            )
            self.explored_s += cost
            # a contender, paced, costs little: tried wherever the model cannot rule it out
            bound = CONTENDERS * self.predicted_s
            close = self.runner_predicted_s is not None and self.runner_predicted_s <= bound
            # a miss either way: a model far off where the choice ran fast may be as far off
            # for the others, and one of them may run faster still
            if (self._missed() or close) and self.runner_up is not None:
                return self._start_trial(self.rotation)
            self._settle(self.choice)
        elif self.phase == "trial":
            self._end_pass(table)
        elif self.phase == "recheck":
            self._end_recheck(table)

    def _missed(self) -> bool:
        """The baseline missed its prediction by more than the margin: either way for the
        model's (far off where the choice ran fast, it may be as far off for the others);
        only above it for a remembered time, whose rival was measured beside it on the same
        machine: a machine now faster for the kept schedule changes no order it measured."""
        if self.remembered:
            return self.seen_s > (1.0 + self.margin) * self.predicted_s
        return abs(self.seen_s - self.predicted_s) > self.margin * self.predicted_s

    def _settle(self, label: str) -> None:
        """Keep ``label``, and count down to its next recheck: ``recheck_after_s``, doubled
        for each recheck in a row that kept the same schedule, of its calls."""
        if self.kept is not None:  # after a recheck: the same one kept, or a new one
            self.confirmed = self.confirmed + 1 if label == self.kept else 0
        self.kept, self.phase, self.live = label, "settled", ()
        if self.recheck_after_s is None:
            return
        wait_s = min(RECHECK_MAX_S, self.recheck_after_s * 2**self.confirmed)
        per_call = self.trial_s.get(label) or self.chosen_s or 0.0
        calls = math.ceil(wait_s / per_call) if per_call > 0 else RECHECK_MIN_CALLS
        self.until_recheck = max(RECHECK_MIN_CALLS, calls)

    def _end_recheck(self, table) -> None:
        # The kept schedule's calls, timed again. Against a candidate the trial measured,
        # as a trial block (its slowest rank's mean call); beaten by more than the margin
        # there, the two meet again in a fresh trial (the old blocks forgotten); so do it
        # and the model's choice it replaced, where that is cheap. Never tried against
        # one: against its own baseline, as the baseline timed it.
        now = block_time(table)
        self.recheck_s = now
        self.elapsed_s += now * (self.warmup + self.window)
        rivals = {k: t for k, t in self.trial_s.items() if k != self.kept}
        rival = min(rivals, key=rivals.get) if rivals else None
        if rival is not None and now > (1.0 + self.margin) * rivals[rival]:
            # one that lost to the kept schedule is back where the kept one slowed past it
            self.lost.pop(rival, None)
            finalists = (self.kept, rival)
        elif self._overturned_cheaply():
            # the model's choice lost a trial, perhaps in one slow spell of a loaded
            # machine: it is timed afresh
            finalists = (self.kept, self.choice)
        elif rival is not None or self.runner_up is None:
            return self._settle(self.kept)
        elif agreed_time(table) <= (1.0 + self.margin) * self.chosen_s:
            return self._settle(self.kept)
        else:  # settled without a trial, and drifted: the whole trial
            finalists = self.rotation
        for label in finalists:  # fresh blocks decide; the old medians only pace the trial
            self.samples.pop(label, None)
        self.trial_s[self.kept] = now
        self._start_trial(finalists)

    def __str__(self) -> str:
        def ms(t):
            return "-" if t is None else f"{t * 1e3:.2f} ms"

        tried = ", ".join(f"{k} {ms(t)}" for k, t in self.trial_s.items()) or "-"
        out = ", ".join(self.lost) or "-"
        again = f", rechecked at {ms(self.recheck_s)}" if self.recheck_s is not None else ""
        return (
            f"{self.choice}: predicted {ms(self.predicted_s)}, measured {ms(self.chosen_s)}; "
            f"tried: {tried}; out: {out}; {self.phase}, kept {self.kept}{again}"
        )


def calls_to_settle(candidates: int) -> int:
    """Calls within which a size settles at the defaults, whatever the timings: the baseline,
    then a trial of ``candidates`` (the choice among them) at the most passes, each after
    the longest hold."""
    block = WARMUP + MAX_BLOCK_CALLS
    return MAX_HOLD + WARMUP + WINDOW + MAX_TRIAL_PASSES * (MAX_HOLD + block * candidates + 1)


def agree(comm, tuning: Tuning, now_s: float) -> tuple[list[list[float]], list[list[float]]]:
    """This phase's times of every rank, and every rank's measure of what the phase cost
    (its phase done at ``now_s``, ``time.perf_counter()``), on every rank, as
    :meth:`Tuning.advance` takes them (collective: every rank, same call).

    ``comm`` gathers them: a :class:`commrt.tuning.hook_comm.HookComm`, whose ``gather_rows``
    is :func:`commrt.runtime.rows.gather`. The decision logic above needs no
    communicator, and this module imports none."""
    n = len(tuning.times)
    table = comm.gather_rows(tuning.times + tuning.cost.columns(now_s, tuning.calls))
    return [row[:n] for row in table], [row[n:] for row in table]
