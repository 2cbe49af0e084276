"""The trial of :mod:`commrt.algorithms.auto_learn`: its passes laid out, paced and ended.

A trial runs passes over its live candidates, a block of back-to-back calls each
(:meth:`TrialPasses._lay_out`); before each pass, what it is expected to cost beyond the
leader's calls is weighed against the size's calls so far, and the leader first runs alone
where it would pass ``explore`` of their time (:meth:`TrialPasses._hold`); after each pass,
one gather, the blocks' times decide who is out and whether the trial is over
(:meth:`TrialPasses._end_pass`). The policy, step by step, is
:mod:`commrt.algorithms.auto_learn`'s; :class:`TrialPasses` is the part of its
:class:`~commrt.algorithms.auto_learn.Tuning` that does this, and reads its fields.
"""

from __future__ import annotations

import math
import statistics

from commrt import settings
from commrt.algorithms.auto_times import block_time

__all__ = [
    "BLOCK_S",
    "MIN_BLOCK_CALLS",
    "MAX_BLOCK_CALLS",
    "MAX_TRIAL_PASSES",
    "WIDE",
    "MAX_HOLD",
    "TrialPasses",
]

BLOCK_S = settings.Seconds(
    0.002,
    "a trial block's timed calls take about this long at the baseline's time a call (so "
    "that where calls are cheap, leaving out the descheduled ones still leaves a mean)",
    "`auto`'s learning",
    settings.AUTO,
)
#: timed calls of a trial block, at least (its slowest is left out) and at most
MIN_BLOCK_CALLS = 3
MAX_BLOCK_CALLS = 12
#: passes of a trial, at most (see TrialPasses.trial_passes)
MAX_TRIAL_PASSES = 6
#: a candidate whose fastest of two or more blocks took over this many times the leader's
#: median is out of the trial: a loss that wide is no noise
WIDE = 1.3
#: calls of a hold, at most (so that a size settles within calls_to_settle)
MAX_HOLD = 400


class TrialPasses:
    """A trial's passes: the part of :class:`~commrt.algorithms.auto_learn.Tuning` that
    lays a pass out, paces it and ends it (module docs); it reads Tuning's fields."""

    @property
    def trial_passes(self) -> int:
        """The trial's passes, at most: :attr:`passes`, or as many more (up to
        :data:`MAX_TRIAL_PASSES`) as fit in :attr:`budget_s` a candidate at the baseline's
        time a call."""
        if self.chosen_s is None:
            return self.passes
        block_s = self.chosen_s * (self.warmup + self.block_calls)
        fit = int(self.budget_s // block_s) if block_s > 0 else MAX_TRIAL_PASSES
        return max(self.passes, min(MAX_TRIAL_PASSES, fit))

    @property
    def seen_s(self) -> float | None:
        """The baseline's time in the statistic of ``predicted_s``: the model prices one
        call (``agreed_time``); a remembered time is a trial's (:func:`block_time`), which
        read 15-20 % lower than the other on 4 ranks sharing 2 cores, so held to the agreed
        time every remembered verdict would miss and be tried again."""
        return self.chosen_block_s if self.remembered else self.chosen_s

    @property
    def block_calls(self) -> int:
        """A block's timed calls: :attr:`block` where given, else :data:`BLOCK_S` at the
        baseline's time a call, within :data:`MIN_BLOCK_CALLS` and :data:`MAX_BLOCK_CALLS`
        (agreed: from an agreed time)."""
        if self.block is not None:
            return self.block
        fill = math.ceil(BLOCK_S / self.chosen_s) if self.chosen_s else MIN_BLOCK_CALLS
        return min(MAX_BLOCK_CALLS, max(MIN_BLOCK_CALLS, fill))

    def _blocks(self) -> tuple[str, ...]:
        """The current pass's blocks in order: :attr:`live` rotated by one a pass.

        A block's place in its pass can cost it: with 4 ranks on 2 cores the block just
        before a pass's gather measured 3-5x the first, and a pass reversed every other time
        keeps a middle block in the middle for good. Rotated, each candidate meets each
        place in turn, and the median of its blocks leaves out one bad place. (The untimed
        call that ends a pass, :meth:`_lay_out`, removed most of that cost.)"""
        k = self.passes_run % len(self.live)
        return self.live[k:] + self.live[:k]

    def _start_trial(self, live: tuple) -> None:
        """Run passes over ``live``, after a hold of the leader if the next pass's expected
        excess would take exploring past :attr:`explore` of the size's time."""
        self.live, self.passes_run = tuple(live), 0
        self._next_pass()

    def _next_pass(self) -> None:
        hold = self._hold()
        if hold > 0:
            self.phase, self.until_recheck = "hold", hold
            self.elapsed_s += hold * self._held_s()
            return
        self.phase, self.plan = "trial", self._lay_out()

    def _lay_out(self) -> tuple[tuple[str, bool], ...]:
        per_block = self.block_calls
        plan = []
        for label in self._blocks():
            plan += [(label, False)] * self.warmup + [(label, True)] * per_block
        # one untimed call after the last block: a rank done with its timed calls waits in it
        # (as between blocks) instead of working on the pass's gather, which, with more ranks
        # than cores, takes the core from a rank still in its timed calls
        return tuple(plan) + ((plan[-1][0], False),)

    def _overturned_cheaply(self) -> bool:
        """Whether the kept schedule replaced the model's choice (still in), and a pass of
        the choice's blocks fits in :attr:`budget_s` at its trial time a call."""
        t = self.trial_s.get(self.choice)
        blocks = self.passes * (self.warmup + self.block_calls)
        cheap = t is not None and t * blocks <= self.budget_s
        return self.kept != self.choice and self.choice not in self.lost and cheap

    def _lead_s(self) -> float:
        return self.trial_s.get(self.leader) or self.chosen_s or self.predicted_s

    def _held_s(self) -> float:
        """What a held call of the leader takes: its trial time (else the baseline's, as a
        block), scaled by a settled call's period over the baseline's calls on the learning
        path, where the hold before the baseline measured it (with 4 ranks on 2 cores a
        learning call keeps its peers waiting too: 8 B calls over shm held at 70 µs where
        the baseline's took 190); never more than the leader's time."""
        lead = self.trial_s.get(self.leader) or self.chosen_block_s
        settled = self.cost.settled_s
        if lead is None or settled is None or not self.chosen_block_s:
            return self._lead_s()
        return lead * min(1.0, settled / self.chosen_block_s)

    def _expected_s(self, label: str) -> float:
        """What a call of ``label`` is expected to take: its median block where it ran, else
        the model's price scaled by the baseline's measured / predicted (half-way to the
        leader's time where the baseline missed: the model's order is then uncertain too),
        and never under ``1 + margin`` × the leader's (a candidate not yet run is assumed
        that much slower, so that a job's first calls run the leader alone)."""
        if label in self.trial_s:
            return self.trial_s[label]
        lead = self._lead_s()
        priced = self.predicted.get(label)
        if priced is None or not self.predicted_s or self.chosen_s is None:
            return lead * WIDE  # not priced: a sure loser on the model's lower bound
        scaled = priced * self.seen_s / self.predicted_s
        guess = lead + (scaled - lead) / 2 if self._missed() else scaled
        return max(guess, (1.0 + self.margin) * lead)

    def _hold(self) -> int:
        """Calls of the leader alone before the next pass (0: none needed)."""
        lead = self._lead_s()
        calls = self.warmup + self.block_calls
        excess = sum(calls * max(0.0, self._expected_s(x) - lead) for x in self.live)
        excess += self.cost.phase(len(self.live) * calls)
        # the calls before the pass pay for it: a pass never pays for itself
        need = (self.explored_s + excess) / self.explore - self.elapsed_s
        held = self._held_s()
        if need <= 0 or held <= 0:
            return 0
        return min(MAX_HOLD, math.ceil(need / held))

    def _end_pass(self, table) -> None:
        # side by side in the same pass: all met the same load (the baseline's time of the
        # choice was taken earlier, perhaps on a quieter or busier machine)
        n, calls = self.block_calls, self.warmup + self.block_calls
        means = []
        for b, label in enumerate(self._blocks()):
            mean = block_time([row[b * n : (b + 1) * n] for row in table])
            self.samples.setdefault(label, []).append(mean)
            means.append(mean)
        self.elapsed_s += calls * sum(means)
        self.explored_s += calls * sum(m - min(means) for m in means)
        self.explored_s += self.cost.phase(len(means) * calls)
        self.passes_run += 1
        self.trial_s.update({x: statistics.median(self.samples[x]) for x in self.live})
        lead = self.leader
        best = self.trial_s[lead]
        for x in self.live:
            fastest = min(self.samples[x])
            if x != lead and len(self.samples[x]) > 1 and fastest > WIDE * best:
                self.lost[x] = self.trial_s[x] / best  # never tried again for this size
        self.live = tuple(x for x in self.live if x not in self.lost)
        close = [
            x for x in self.live if x != lead and min(self.samples[x]) <= (1 + self.margin) * best
        ]
        done = len(self.live) == 1 or self.passes_run >= self.trial_passes
        if done or (self.passes_run >= self.passes and not close):
            return self._settle(lead)
        self._next_pass()
