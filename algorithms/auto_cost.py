"""What ``auto``'s learning costs beyond settled calls, as the job measures it: :class:`LearningCost`.

``auto`` paces its learning (:mod:`commrt.algorithms.auto_learn`): a phase that times
calls, and the gather that ends it, may cost at most ``explore`` of a size's calls so far.
A call on the learning path costs more than a settled one: it is resolved, selected and
observed, and where ranks share cores each rank's extra work also delays its peers inside
the schedule itself. Over shm, 8 B a call, on 2 cores: at p = 2 a baseline's call took about
10 µs more than a held one; at p = 4 about 80 µs more (170 against 86-90), and the phase's
gather 340 µs, where the constants that stood in for them said 25 and 300.

So each rank measures it in a size's baseline, which runs one schedule right after the
hold that pays for it, the same schedule on the settled path:

* the hold's period: the time from the end of its first call (which compiled and bound the
  schedule) to the baseline's first call, over the calls between (the caller's own work
  between calls included);
* the baseline's excess: the time from its first call to its last call's end, less as many
  periods. The caller's work between calls is in both, and cancels;
* the gather's own time, sent with the next phase's row.

Not in a recheck: the settled calls before one span seconds, which may hold a pause of the
caller's or other work (a benchmark's other rounds read as settled calls there, and the
recheck as costing nothing).

The hold's period is also what a held call takes: the pacing counts held calls at it
(:class:`~commrt.algorithms.auto_trial.TrialPasses`), where the learning path's calls read
up to 2.5x slower.

Every rank sends its three numbers in its phase's row (:meth:`LearningCost.columns`), so every
rank reads the same table and takes the same medians (:meth:`LearningCost.read`): the
estimates the pacing uses are agreed. Until a phase has measured them, the estimates are
what another size's phases measured on the same communicator (:meth:`LearningCost.like`),
else the settings :data:`LEARN_CALL_S` and :data:`GATHER_S`, or where more, as many of the
probe's α as :data:`LEARN_CALL_ALPHAS` and :data:`GATHER_ALPHAS` say. Both costs are
latency-bound: a gather is a small all-reduce, and a rank that waits on the learning path
keeps its peers waiting on its messages. On 2 cores over shm, with α = 6.7 µs at p = 2 and
40 µs at p = 4, a phase's gather and the decision after it took 150 µs and 700-900 µs
(about 20 α), a learning call's excess 10 and 80 µs (about 2 α): the settings alone
priced p = 2 well above and p = 4 well below.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from commrt import settings

__all__ = ["LEARN_CALL_S", "GATHER_S", "LEARN_CALL_ALPHAS", "GATHER_ALPHAS", "LearningCost"]

LEARN_CALL_S = settings.Seconds(
    25e-6,
    "what a call on auto's learning path costs beyond a settled one, paced as exploring is, "
    "until the job has measured it (or, where more, LEARN_CALL_ALPHAS × the probe's α)",
    "`auto`'s learning",
    settings.AUTO,
)
GATHER_S = settings.Seconds(
    300e-6,
    "what a phase's gather of auto's timings and the decision after it cost, paced as "
    "exploring is, until the job has measured it (or, where more, GATHER_ALPHAS × the "
    "probe's α)",
    "`auto`'s learning",
    settings.AUTO,
)
#: a learning call's excess, in the probe's α, where that is more than LEARN_CALL_S
LEARN_CALL_ALPHAS = 2.0
#: a phase's gather and the decision after it, in the probe's α, where more than GATHER_S
GATHER_ALPHAS = 20.0
#: measurements an estimate is the median of, the latest kept
KEPT = 5


@dataclass
class LearningCost:
    """One size's estimates of what learning costs (module docs), and this rank's clock
    readings they are measured from (``time.perf_counter()`` seconds, given by the caller).

    ``call_s``: a learning call's cost beyond a settled one; ``gather_s``: a phase's gather.
    ``calls_s``, ``gathers_s``: the agreed measurements so far (their medians are the
    estimates). ``settled_from_s``: when the hold before the baseline began,
    ``settled_calls`` its calls; ``phase_from_s``: the baseline's first call;
    ``last_gather_s``: this rank's last gather (NaN: none measured yet); ``settled_s``:
    a settled call's period, as the ranks measured it in the hold before the baseline
    (None: not measured)."""

    call_s: float = LEARN_CALL_S
    gather_s: float = GATHER_S
    calls_s: list = field(default_factory=list)
    gathers_s: list = field(default_factory=list)
    settled_from_s: float | None = None
    settled_calls: int = 0
    phase_from_s: float | None = None
    last_gather_s: float = math.nan
    settled_s: float | None = None

    @classmethod
    def like(cls, others, alpha_s: float | None = None) -> "LearningCost":
        """Estimates started from ``others``' (other sizes' costs on the same communicator):
        the medians of those that measured; where none did, the settings, or as many of
        ``alpha_s`` (the probe's α; None: not probed) as :data:`LEARN_CALL_ALPHAS` and
        :data:`GATHER_ALPHAS` say, where that is more."""
        calls = [c.call_s for c in others if c.calls_s]
        gathers = [c.gather_s for c in others if c.gathers_s]
        cost = cls()
        if alpha_s is not None:
            cost.call_s = max(cost.call_s, LEARN_CALL_ALPHAS * alpha_s)
            cost.gather_s = max(cost.gather_s, GATHER_ALPHAS * alpha_s)
        if calls:
            cost.call_s = statistics.median(calls)
        if gathers:
            cost.gather_s = statistics.median(gathers)
        return cost

    def phase(self, calls: int) -> float:
        """A phase of ``calls`` learning calls and a gather, as estimated."""
        return calls * self.call_s + self.gather_s

    def settled(self, now_s: float, calls: int) -> None:
        """Settled calls start now (``calls`` of them before the next learning phase)."""
        self.settled_from_s, self.settled_calls, self.phase_from_s = now_s, calls, None

    def started(self, now_s: float) -> None:
        """The current phase's first call starts now."""
        if self.phase_from_s is None:
            self.phase_from_s = now_s

    def gathered(self, seconds: float) -> None:
        """This rank's gather took ``seconds`` (sent with the next phase's row)."""
        self.last_gather_s = seconds

    def columns(self, now_s: float, calls: int) -> list[float]:
        """This rank's three numbers for its phase's row, the phase's ``calls`` done by
        ``now_s``: its excess over as many settled calls and a settled call's period (NaN
        where it cannot tell: no settled calls just before), and its last gather's
        seconds."""
        excess = period = math.nan
        if self.settled_from_s is not None and self.phase_from_s is not None:
            if self.settled_calls > 0:
                period = (self.phase_from_s - self.settled_from_s) / self.settled_calls
                excess = (now_s - self.phase_from_s) - calls * period
        self.settled_from_s = self.phase_from_s = None
        return [excess, self.last_gather_s, period]

    def read(self, columns, calls: int) -> float:
        """Take the ranks' ``columns`` (each rank's :meth:`columns`, in the table every rank
        holds; None: not measured) of a phase of ``calls`` calls; return what the phase
        cost, its gather included: measured where every rank measured it, else as
        estimated."""
        if columns is None:
            return self.phase(calls)
        excess, gathers, periods = ([row[i] for row in columns] for i in range(3))
        if not any(math.isnan(t) for t in periods):
            self.settled_s = statistics.median(periods)
        if not any(math.isnan(g) for g in gathers):
            self.gathers_s = (self.gathers_s + [statistics.median(gathers)])[-KEPT:]
            self.gather_s = statistics.median(self.gathers_s)
        if calls <= 0 or any(math.isnan(e) for e in excess):
            return self.phase(calls)
        measured = max(0.0, statistics.median(excess))
        self.calls_s = (self.calls_s + [measured / calls])[-KEPT:]
        self.call_s = statistics.median(self.calls_s)
        return measured + self.gather_s
