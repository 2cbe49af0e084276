"""How ``algorithm="auto"`` learns from what it runs: one size's baseline, trial and verdict.

The policy
----------
For each buffer size, ``commrt.all_reduce(..., algorithm="auto")`` times
the calls it makes (:meth:`Tuning.record`), in phases of :data:`WINDOW`
timed calls after :data:`WARMUP` untimed ones (the first call of a
schedule compiles its plan and allocates scratch):

1. **baseline**: time the model's choice. Its time is agreed across ranks as the
   median over the window of each call's *slowest* rank (a synchronous
   collective ends when its last rank does). If it is within
   ``MARGIN`` (10%) of its prediction, either way, and the runner-up is not a
   close call (predicted within the same margin of the choice: closer
   than the model can tell apart), the choice stays: **settled**.
2. Else **trial**: the next calls run the runner-up for that size (the
   model's second cheapest, even one pricing had left out as a sure loser),
   every other candidate predicted within :data:`CONTENDERS` × the
   choice, and the choice, each in blocks of back-to-back calls, as the
   kept one will run: passes over them, every other one in reverse order
   so that a drift in the machine's load meets all alike, each block
   :data:`WARMUP` untimed calls and then ⌈WINDOW / TRIAL_PASSES⌉ timed
   ones. A block's time is its slowest rank's mean call: the throughput
   of back-to-back calls, which is what the kept schedule will cost; a
   candidate's, the median of its blocks. There are :data:`TRIAL_PASSES`
   passes, or as many more (up to :data:`MAX_TRIAL_PASSES`) as fit in
   :data:`TRIAL_BUDGET_S` per candidate at the baseline's time a call: where
   calls take milliseconds, one stall of another process swamps a block,
   and only a median over many blocks is steady. Blocks of back-to-back
   calls, timed by their mean, rather than single calls in turn timed by
   their median: a schedule whose calls alternate fast and slow has a
   median call well below the mean it really costs.
   **Rematch**: if the fastest is not the model's choice, the two meet
   again on fresh blocks and the verdict is on those alone: overturning
   the model takes two trials that agree (one trial can time the model's
   choice in a slow spell and keep a slower schedule). If the choice is the
   fastest but the runner-up in the trial came within ``MARGIN`` of it,
   closer than one trial's blocks can tell apart on a loaded machine
   (where single calls spike to several times their median), those two run one
   more trial, and the verdict is on every block each has had. One
   rematch at most.
3. **verdict**: the fastest by the median of its blocks is kept for
   that size from then on (``commrt.algorithms.auto.choices`` shows it,
   with ``learned=True`` if it is the runner-up), and the size is settled.
   ``commrt.all_reduce`` then runs the kept schedule for repeats of that
   call without asking ``select`` or ``observe`` (``commrt.collectives.memo.SettledCall``),
   only counting them.
4. **recheck**: after :data:`RECHECK_S` seconds' worth of the kept
   schedule's calls (at its measured time a call; at least
   :data:`RECHECK_MIN_CALLS` calls), the next calls are timed again, as a
   trial block (the slowest rank's mean call). A machine drifts, and a
   schedule's calls can settle into a slower mode: the winner of a trial
   may fall behind the schedule it beat. If the kept schedule is now
   slower than the trial's fastest other candidate by more than ``MARGIN``,
   the two meet again on fresh blocks (a rematch; their old blocks are
   dropped) and the faster is kept. A kept schedule that replaced the
   model's choice meets that choice again on fresh blocks at each recheck,
   where :data:`TRIAL_PASSES` of its blocks fit in :data:`TRIAL_BUDGET_S`
   at its trial time: two trials can fall in one slow spell of a loaded
   machine. A choice that settled without a trial is
   held to its own baseline time instead, and the whole trial runs if it
   drifted past it. Each recheck that keeps the same schedule doubles the
   wait before the next, up to :data:`RECHECK_MAX_S`; a change starts it
   again. ``Auto(recheck_s=None)`` never rechecks.

Every rank decides from the same numbers: a phase's times reach every
rank in one small gather (:func:`commrt.runtime.rows.gather`, an exact all-reduce
of a p × (timed calls) table) at the end of the phase, never per call, so
a size costs at most three such gathers (one or two more per recheck), and WINDOW + P ×
⌈WINDOW / TRIAL_PASSES⌉ × (k + 1 + 2) timed calls for k tried candidates
and a rematch, P the trial's passes (2 where a call takes over 21 ms, 6
where it takes 10 ms or less), in the life of a communicator. Calls
through ``commrt.all_reduce`` are the ones timed; GradientSync and the
torch.distributed backend use what was learned for the same communicator
(a GradientSync picks its schedules when it is made).

:class:`Tuning` is the pure decision state (tested with injected timings,
no processes); :func:`agree` is the one collective step.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from commrt import settings

__all__ = [
    "MARGIN",
    "WINDOW",
    "WARMUP",
    "CONTENDERS",
    "TRIAL_PASSES",
    "TRIAL_BUDGET_S",
    "MAX_TRIAL_PASSES",
    "RECHECK_S",
    "RECHECK_MAX_S",
    "RECHECK_MIN_CALLS",
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
#: passes of the trial over the tried candidates and the choice (every other one reversed),
#: at least; a block's timed calls are ⌈WINDOW / TRIAL_PASSES⌉
TRIAL_PASSES = 2
TRIAL_BUDGET_S = settings.Seconds(
    0.25,
    "a trial takes more passes while a candidate's blocks take at most this long",
    "`auto`'s learning",
    settings.AUTO,
)
MAX_TRIAL_PASSES = 6
#: the trial also runs every candidate predicted within this factor of the choice: where
#: the model errs by tens of percent (small buffers, a loaded machine) its order among
#: them says little, and the runner-up alone can miss the fastest
CONTENDERS = 1.5
RECHECK_S = settings.Seconds(
    2.0,
    "seconds of a settled size's calls before its kept schedule is timed again; doubling after "
    "each recheck that keeps it",
    "`auto`'s learning",
    settings.AUTO,
)
RECHECK_MAX_S = settings.Seconds(
    64.0, "the longest time between two rechecks", "`auto`'s learning", settings.AUTO
)
#: settled calls between rechecks, at least: a recheck costs one small gather
RECHECK_MIN_CALLS = 50


@dataclass
class Tuning:
    """What ``auto`` has learned for one (Auto, world size, buffer size).

    ``predicted_s``: the model's time for its choice; ``runner_up``: the
    label of the model's second choice (None: nothing to try), predicted at
    ``runner_predicted_s``; ``others``: further candidates the trial runs
    beside it (those predicted within :data:`CONTENDERS` × the choice).
    ``phase`` is ``"baseline"``, ``"trial"`` or ``"settled"``; ``kept`` the
    label kept once settled; ``chosen_s`` the choice's agreed time in the
    baseline, ``trial_s`` every tried label's agreed time in the trial
    (``runner_s`` and ``beside_s``: the runner-up's and the choice's).
    """

    choice: str
    predicted_s: float
    runner_up: str | None
    runner_predicted_s: float | None = None  # None: not priced (left out as a sure loser)
    others: tuple[str, ...] = ()
    margin: float = MARGIN
    window: int = WINDOW
    warmup: int = WARMUP
    passes: int = TRIAL_PASSES  # the trial's passes, at least (see trial_passes)
    budget_s: float = TRIAL_BUDGET_S
    phase: str = "baseline"
    kept: str | None = None
    chosen_s: float | None = None
    trial_s: dict = field(default_factory=dict)
    #: the current trial's calls as (label, timed), laid out when it starts (see trial_plan)
    plan: tuple = ()
    #: the rematch's two labels, once the trial's two fastest came out close (else empty)
    finalists: tuple = ()
    #: every tried label's block times (the slowest rank's mean call), trial and rematch
    samples: dict = field(default_factory=dict)
    #: this rank's seconds in the current phase, and the calls made in it (timed or not)
    times: list = field(default_factory=list)
    calls: int = 0
    #: seconds of settled calls before the first recheck (None: never recheck); rechecks
    #: in a row that found the kept schedule still the fastest (each doubles the wait);
    #: settled calls left before the next; the kept schedule's time at the last recheck
    recheck_after_s: float | None = RECHECK_S
    confirmed: int = 0
    until_recheck: int = 0
    recheck_s: float | None = None

    @property
    def rotation(self) -> tuple[str, ...]:
        """The trial's candidates in their first pass's order: the runner-up, the others,
        then the choice (in a rematch, its two finalists)."""
        return self.finalists or (self.runner_up, *self.others, self.choice)

    def trial_plan(self) -> tuple[tuple[str, bool], ...]:
        """The current trial's calls in order, as ``(label, timed)``: :attr:`trial_passes`
        passes over :attr:`rotation` (every other one reversed), a block of back-to-back
        calls for each, its first :attr:`warmup` untimed. Laid out once when the trial
        (or its rematch) starts: every call of it asks."""
        return self.plan

    def _lay_out(self) -> tuple[tuple[str, bool], ...]:
        per_block = self._per_block()
        plan = []
        for label in self._blocks():
            plan += [(label, False)] * self.warmup + [(label, True)] * per_block
        return tuple(plan)

    @property
    def trial_passes(self) -> int:
        """The trial's passes: :attr:`passes`, or as many more (up to
        :data:`MAX_TRIAL_PASSES`) as fit in :attr:`budget_s` a candidate at the baseline's
        time a call."""
        if self.chosen_s is None:
            return self.passes
        block_s = self.chosen_s * (self.warmup + self._per_block())
        fit = int(self.budget_s // block_s) if block_s > 0 else MAX_TRIAL_PASSES
        return max(self.passes, min(MAX_TRIAL_PASSES, fit))

    def _per_block(self) -> int:
        return -(-self.window // self.passes)

    def _blocks(self) -> list[str]:
        """The trial's blocks in order, by label: each pass over :attr:`rotation`, every
        other one reversed."""
        rotation = self.rotation
        return [x for k in range(self.trial_passes) for x in rotation[:: -1 if k % 2 else 1]]

    @property
    def running(self) -> str:
        """The label of the candidate the next call runs (in the trial, as
        :meth:`trial_plan` lays the calls out)."""
        if self.phase != "trial":
            return self.kept or self.choice
        return self.plan[self.calls][0]

    @property
    def runner_s(self) -> float | None:
        return self.trial_s.get(self.runner_up)

    @property
    def beside_s(self) -> float | None:
        return self.trial_s.get(self.choice)

    @property
    def timing(self) -> bool:
        """Whether the next call is timed (the caller synchronises a GPU only then)."""
        if self.phase == "trial":
            return self.plan[self.calls][1]
        return self.phase in ("baseline", "recheck") and self.calls >= self.warmup

    def settled_call(self) -> bool:
        """Count one call of the settled schedule (every rank counts the same calls); True
        when it was the last before a recheck: the caller must then bring the next calls
        back to :meth:`record` (``commrt.collectives.memo`` drops its memo of the call)."""
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
        if self.phase == "settled":
            return False
        timed = self.timing
        self.calls += 1
        if not timed:
            return False
        self.times.append(float(seconds))
        if self.phase == "trial":
            return self.calls >= len(self.plan)
        return len(self.times) >= self.window

    def advance(self, table) -> None:
        """End the phase with every rank's times (``table``: one row per rank, the same on
        every rank): the choice's, or in the trial every tried candidate's and the
        choice's as :meth:`trial_plan` laid them out, a sample per block."""
        self.times, self.calls = [], 0
        if self.phase == "baseline":
            self.chosen_s = agreed_time(table)
            bound = (1.0 + self.margin) * self.predicted_s
            close = self.runner_predicted_s is not None and self.runner_predicted_s <= bound
            # a miss either way: a model far off where the choice ran fast may be as far off
            # for the others, and one of them may run faster still
            missed = abs(self.chosen_s - self.predicted_s) > self.margin * self.predicted_s
            if (missed or close) and self.runner_up is not None:
                self.phase, self.plan = "trial", self._lay_out()
                return
            self._settle(self.choice)
        elif self.phase == "trial":
            self._end_trial(table)
        elif self.phase == "recheck":
            self._end_recheck(table)

    def _settle(self, label: str) -> None:
        """Keep ``label``, and count down to its next recheck: ``recheck_after_s``, doubled
        for each recheck in a row that kept the same schedule, of its calls."""
        if self.kept is not None:  # after a recheck: the same one kept, or a new one
            self.confirmed = self.confirmed + 1 if label == self.kept else 0
        self.kept, self.phase = label, "settled"
        if self.recheck_after_s is None:
            return
        wait_s = min(RECHECK_MAX_S, self.recheck_after_s * 2**self.confirmed)
        per_call = self.trial_s.get(label) or self.chosen_s or 0.0
        calls = math.ceil(wait_s / per_call) if per_call > 0 else RECHECK_MIN_CALLS
        self.until_recheck = max(RECHECK_MIN_CALLS, calls)

    def _end_recheck(self, table) -> None:
        # The kept schedule's calls, timed again. Against a candidate the trial measured,
        # as a trial block (its slowest rank's mean call); beaten by more than the margin
        # there, the two meet again on fresh blocks (a rematch, the old blocks forgotten);
        # so do it and the model's choice it replaced, where that is cheap. Never tried
        # against one: against its own baseline, as the baseline timed it.
        now = max(statistics.fmean(row) for row in table)
        self.recheck_s = now
        rivals = {k: t for k, t in self.trial_s.items() if k != self.kept}
        rival = min(rivals, key=rivals.get) if rivals else None
        if rival is not None and now > (1.0 + self.margin) * rivals[rival]:
            self.finalists = (self.kept, rival)
        elif self._overturned_cheaply():
            # the model's choice lost two trials, perhaps both in one slow spell of a loaded
            # machine: it is timed afresh
            self.finalists = (self.kept, self.choice)
        elif rival is not None or self.runner_up is None:
            return self._settle(self.kept)
        elif agreed_time(table) <= (1.0 + self.margin) * self.chosen_s:
            return self._settle(self.kept)
        for label in self.finalists:  # (none where nothing was tried yet: a whole trial)
            self.samples.pop(label, None)
        self.phase, self.plan = "trial", self._lay_out()

    def _overturned_cheaply(self) -> bool:
        """Whether the kept schedule replaced the model's choice, and a rematch's blocks of
        the choice fit in :attr:`budget_s` at its trial time a call."""
        t = self.trial_s.get(self.choice)
        blocks = self.passes * (self.warmup + self._per_block())
        return self.kept != self.choice and t is not None and t * blocks <= self.budget_s

    def _end_trial(self, table) -> None:
        # side by side in the same passes: all met the same load (the baseline's time of the
        # choice was taken earlier, perhaps on a quieter or busier machine). A block's
        # sample is its slowest rank's mean call, the throughput of back-to-back calls: a
        # median of single calls favoured a schedule whose calls alternate fast and slow
        # (its median call is well below its mean)
        n = self._per_block()
        for b, label in enumerate(self._blocks()):
            mean = max(statistics.fmean(row[b * n : (b + 1) * n]) for row in table)
            self.samples.setdefault(label, []).append(mean)
        self.trial_s = {label: statistics.median(t) for label, t in self.samples.items()}
        # ties go to the model's choice, then to the runner-up, then the others' order; a
        # rematch decides between its two finalists only
        order = (self.choice, self.runner_up, *self.others)
        pool = self.finalists or order
        best, second = sorted(pool, key=lambda x: (self.trial_s[x], order.index(x)))[:2]
        if self.finalists:
            return self._settle(best)
        if best != self.choice:
            # overturning the model takes a second look on fresh blocks: one trial can time
            # the model's choice in a slow spell and keep a slower schedule
            self.finalists = (best, self.choice)
            for label in self.finalists:
                self.samples.pop(label)
        elif self.trial_s[second] <= (1.0 + self.margin) * self.trial_s[best]:
            self.finalists = (best, second)
        else:
            return self._settle(best)
        self.plan = self._lay_out()

    def __str__(self) -> str:
        def ms(t):
            return "-" if t is None else f"{t * 1e3:.2f} ms"

        tried = ", ".join(f"{k} {ms(t)}" for k, t in self.trial_s.items()) or "-"
        again = f", rechecked at {ms(self.recheck_s)}" if self.recheck_s is not None else ""
        return (
            f"{self.choice}: predicted {ms(self.predicted_s)}, measured {ms(self.chosen_s)}; "
            f"tried: {tried}; {self.phase}, kept {self.kept}{again}"
        )


def calls_to_settle(candidates: int) -> int:
    """Calls within which a size settles at the defaults, whatever the timings: the baseline,
    a trial of ``candidates`` (the choice among them) at the most passes, and a rematch."""
    block = WARMUP + -(-WINDOW // TRIAL_PASSES)
    return WARMUP + WINDOW + MAX_TRIAL_PASSES * block * (candidates + 2)


def agreed_time(table) -> float:
    """Per call the slowest rank's seconds, then the median over the calls (``table``: one
    row of times per rank)."""
    return statistics.median(max(col) for col in zip(*table))


def agree(comm, tuning: Tuning) -> list[list[float]]:
    """This phase's times of every rank, on every rank (collective: every rank, same call).

    ``comm`` gathers them: a :class:`commrt.tuning.hook_comm.HookComm`, whose ``gather_rows``
    is :func:`commrt.runtime.rows.gather`. The decision logic above needs no
    communicator, and this module imports none."""
    return comm.gather_rows(tuning.times)
