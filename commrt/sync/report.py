"""What a GradientSync did, in terms every algorithm family shares.

A tool that trains with any family (``commrt train``, a user's loop) asks
``sync.report()`` instead of asking which family it runs: whether ranks may
fail (so nothing may wait on all of them), whether the ranks' models drift
apart between consensus points, whether this rank is done, and the rows the
family wants in a summary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyncReport:
    """A family-neutral account of a :class:`~commrt.GradientSync` (``sync.report()``).

    Example::

        >>> r = SyncReport(("avg", "avg"), global_step=12)
        >>> print(r)
        algorithms   avg (2 buckets)
        global step  12
    """

    #: what each bucket ran (the policy's label per bucket)
    algorithms: tuple[str, ...]
    #: the global step this rank's parameters and optimizer state hold
    global_step: int
    #: this rank has nothing more to do: further steps are no-ops, a loop may stop
    finished: bool = False
    #: ranks may die or run at their own pace while the others go on: nothing may wait
    #: on all of them (evaluate locally, report one rank's view, plan in global steps)
    ranks_may_fail: bool = False
    #: the ranks' models differ between consensus points (average_parameters agrees them)
    models_drift: bool = False
    #: ranks this one lost (dead, or silent too long): a collective would wait on them
    missing_ranks: tuple[int, ...] = ()
    #: the family's own (label, value) rows for a summary table
    rows: tuple[tuple[str, str], ...] = ()
    #: what ``close()`` does that may take a while ("" when it returns at once)
    closing: str = ""

    @classmethod
    def of(cls, policy, algorithms: tuple[str, ...], global_step: int) -> "SyncReport":
        """The report of a sync whose buckets ran ``algorithms``, from its family's policy."""
        return cls(
            algorithms=algorithms,
            global_step=global_step,
            finished=policy.finished,
            ranks_may_fail=policy.ranks_may_fail,
            models_drift=policy.models_drift,
            missing_ranks=tuple(policy.missing_ranks),
            rows=tuple(policy.summary()),
            closing=policy.closing,
        )

    def table(self) -> list[tuple[str, str]]:
        """Every (label, value) row: the shared ones, then the family's."""
        ran = ", ".join(dict.fromkeys(self.algorithms))
        return [
            ("algorithms", f"{ran} ({len(self.algorithms)} buckets)"),
            ("global step", str(self.global_step)),
            *self.rows,
        ]

    def __str__(self) -> str:
        return render_rows(self.table())


def render_rows(rows: list[tuple[str, str]]) -> str:
    """(label, value) rows as two aligned columns."""
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)
