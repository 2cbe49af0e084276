"""Synchronous SGD with backup workers (Chen et al., "Revisiting Distributed Synchronous SGD").

Run N + b workers. Each global step averages the gradients of the first N
workers to be ready and drops the b late ones, so the slowest workers no
longer set the pace, without the staleness of asynchronous SGD. A late
worker catches up to the latest global state and computes its next
gradient there (see :mod:`commrt.sync.backup` for how GradientSync does it).

As a schedule, a step is the ``inner`` all-reduce run over the N ranks that
came first, restricted to that subset with ``schedule(world_size, ranks=...)``
(no new communicators). Which N ranks those are is decided at run time
through a store, so this class alone cannot run an all-reduce over a
communicator: use it with :class:`commrt.GradientSync`.

Example::

    >>> from commrt.algorithms import BackupWorkers
    >>> bw = BackupWorkers(backups=1)                  # also algorithm="backup"
    >>> bw.participants(4)
    3
    >>> s = bw.schedule(4, ranks=(0, 1, 3))            # step where rank 2 was late
    >>> s.ranks, s.check().ok
    ((0, 1, 3), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.algorithms.names import BACKUP, key, named
from commrt.errors import named_keywords
from commrt.schedule import Collective, Schedule


@named_keywords
@dataclass(frozen=True)
class BackupWorkers(Algorithm):
    """First N of N + ``backups`` gradients per global step; ``inner`` all-reduces them.

    Args:
        backups: b, the number of workers whose gradients each step may drop
            (0 is plain synchronous SGD, through the same machinery).
        inner: the all-reduce among the N on-time ranks: a name (``ring``,
            ``halving_doubling``, ``torus2d``, ``auto``) or an instance. A
            ``Torus2D`` shape must fit N.
        dead_after_s: a rank whose heartbeat (sent through the store every
            quarter second, or every ``dead_after_s / 8`` if that is
            shorter) has not moved for this long is recorded dead by the
            rank that watches it: every rank then reports it missing within
            one more beat, and ``close()`` stops waiting for it. A live rank
            paused for longer (swapping, SIGSTOP) finds itself declared dead
            and raises ``RankDeclaredDeadError``; raise this above any pause a
            live process may take.
    """

    backups: int = 1
    inner: "str | Algorithm" = "ring"
    dead_after_s: float = 2.0

    name = "backup"
    family = "backup"

    def __post_init__(self):
        if isinstance(self.backups, bool) or not isinstance(self.backups, int) or self.backups < 0:
            raise ValueError(
                f"BackupWorkers backups must be a non-negative integer, got {self.backups!r}"
            )
        inner = self.inner
        if isinstance(inner, str):  # "backup" is refused below, as the instance would be
            inner = None if key(inner) == BACKUP else named(inner)
        elif not isinstance(inner, Algorithm):
            raise TypeError(
                f"algorithm must be a name or an Algorithm instance, got {type(inner).__name__}"
            )
        if (
            inner is None
            or isinstance(inner, BackupWorkers)
            or not inner.supports(Collective.ALL_REDUCE)
        ):
            raise ValueError(
                f"BackupWorkers inner must be an all-reduce algorithm (ring, "
                f"halving_doubling, torus2d, auto), got {self.inner!r}"
            )
        object.__setattr__(self, "inner", inner)
        if (
            isinstance(self.dead_after_s, bool)
            or not isinstance(self.dead_after_s, (int, float))
            or not math.isfinite(self.dead_after_s)
            or self.dead_after_s <= 0
        ):
            raise ValueError(
                f"BackupWorkers dead_after_s must be a positive number of seconds, "
                f"got {self.dead_after_s!r}"
            )

    def participants(self, world_size: int) -> int:
        """N: how many gradients each global step averages on ``world_size`` ranks."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if world_size <= self.backups:
            raise ValueError(
                f"BackupWorkers(backups={self.backups}) needs more than "
                f"{self.backups} ranks (N + b with N >= 1), but there are "
                f"{world_size}"
            )
        return world_size - self.backups

    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        """The inner all-reduce over ``ranks``, the N on-time ranks of one step
        (default: the first N ranks)."""
        self.refuse_unless_all_reduce(collective)
        n = self.participants(world_size)
        ranks = participants(world_size, ranks if ranks is not None else range(n))
        return self.inner.schedule(world_size, ranks)

    def select(self, world_size: int, nbytes: int, comm=None) -> Schedule:
        raise ValueError(
            "backup workers average the first N gradients of a training step, which "
            "only GradientSync(model, comm, algorithm='backup') can decide; "
            "commrt.all_reduce needs every rank's tensor: use ring, "
            "halving_doubling, torus2d or auto"
        )

    def __str__(self) -> str:
        return f"{self.name}(b={self.backups}, {self.inner})"
