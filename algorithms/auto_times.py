"""How ``auto`` turns its ranks' timings of a phase into one time a call.

Both take a *table*: one row of this phase's call times per rank, the same on every rank
(:func:`commrt.algorithms.auto_learn.agree` gathers it), so every rank computes the same
number. A synchronous collective ends when its last rank does, so both go by the slowest
rank; they differ in what they must be robust to:

* :func:`agreed_time`, a window of single calls (the baseline): the median over the calls of
  each call's slowest rank;
* :func:`block_time`, a trial block of back-to-back calls: the throughput the kept schedule
  will have (a schedule whose calls alternate fast and slow by nature is charged its slow
  calls), less the calls in which a rank was descheduled.
"""

from __future__ import annotations

import statistics

__all__ = ["OUTLIER", "agreed_time", "block_time"]

#: a call over this many times its block's median (on its rank) is one in which a rank was
#: descheduled, left out of the block's time: on 2 cores those took 10-15x the median, while
#: a schedule whose calls alternate fast and slow by its own nature measured at most 2x
OUTLIER = 4.0


def block_time(table) -> float:
    """A block of back-to-back calls' time a call (``table``: one row of times per rank):
    the slowest rank's mean call, less each rank's calls over :data:`OUTLIER` × its median
    (those in which it or a peer was descheduled), at most a quarter of them (at least one,
    where it has three calls or more)."""

    def trimmed(row):
        most = max(1, len(row) // 4) if len(row) >= 3 else 0
        bound = OUTLIER * statistics.median(row)
        drop = min(most, sum(t > bound for t in row))
        return statistics.fmean(sorted(row)[: len(row) - drop])

    return max(trimmed(row) for row in table)


def agreed_time(table) -> float:
    """Per call the slowest rank's seconds, then the median over the calls (``table``: one
    row of times per rank)."""
    return statistics.median(max(col) for col in zip(*table))
