"""The algorithm interface and the name registry behind ``algorithm="..."``."""

from __future__ import annotations

import abc
from typing import ClassVar, Sequence

from commrt.schedule import Collective, Schedule


class Algorithm(abc.ABC):
    """A way to run a collective, described as a :class:`commrt.Schedule`.

    Subclasses are frozen dataclasses that carry their options, so an
    instance is hashable and its schedules can be cached per world size.
    """

    #: name accepted by ``algorithm="..."``
    name: ClassVar[str]

    @abc.abstractmethod
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        """The schedule for ``world_size`` ranks (or the subset ``ranks``)."""

    def select(self, world_size: int, nbytes: int, comm=None) -> Schedule:
        """The all-reduce schedule to run on a buffer of ``nbytes``.

        ``comm`` (a :class:`~commrt.Communicator`, optional) gives context:
        ranks per node for shape choices, and a place to cache what a
        size-aware algorithm probed. Called collectively (every rank, same
        order), so implementations may communicate. Default: the one
        schedule for ``world_size``.
        """
        return self.schedule(world_size)

    def supports(self, collective: Collective) -> bool:
        return collective is Collective.ALL_REDUCE

    def __str__(self) -> str:
        return self.name


def participants(world_size: int, ranks: Sequence[int] | None) -> tuple[int, ...]:
    """Validate and normalise the ``ranks`` argument every algorithm takes."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if ranks is None:
        return tuple(range(world_size))
    ranks = tuple(int(r) for r in ranks)
    if not ranks:
        raise ValueError("ranks must name at least one rank")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks must be distinct, got {ranks}")
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"ranks {bad} are outside 0..{world_size - 1}")
    return ranks
