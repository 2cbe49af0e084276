"""The algorithm interface and the name registry behind ``algorithm="..."``."""

from __future__ import annotations

import abc
from typing import ClassVar, Sequence

from commrt.schedule import Collective, Schedule


class Algorithm(abc.ABC):
    """A way to run a collective, described as a :class:`commrt.Schedule`.

    Subclasses are frozen dataclasses that carry their options, so an
    instance is hashable and its schedules can be cached per world size.

    Every hook that another part of commrt calls is declared here, with its
    default: the collectives call :meth:`select`, :meth:`observe`,
    :meth:`settled_counter` and :meth:`phase_timer` (and read :attr:`learns`), the
    simulator :meth:`on_network` and :meth:`select`, GradientSync :attr:`family` and
    :meth:`sync_policy`. Callers call them directly, never by looking for them.
    Pricing is not a hook: :mod:`commrt.sim.pricing` knows the closed forms by
    algorithm type.

    The ``comm`` these hooks receive is what the layer above hands down: a
    :class:`commrt.tuning.hook_comm.HookComm` (a communicator as a choice sees it:
    ``rank``, ``world_size``, ``device``, ``slots``, ``local_size`` as every rank
    agreed, ``network()`` probed, ``gather_rows()``, ``synchronize()``), or any object
    with the attributes an algorithm reads. Algorithms never import the
    communicator, the simulator or the probe: what they need of them comes in
    through ``comm`` and through the network they are given.
    """

    #: name accepted by ``algorithm="..."``
    name: ClassVar[str]
    #: which GradientSync family runs it: "allreduce" (every bucket all-reduced), "gossip"
    #: or "backup"; :mod:`commrt.sync.families` maps each to its policy class
    family: ClassVar[str] = "allreduce"
    #: whether :meth:`select` may answer differently as :meth:`observe` learns: the
    #: collectives then time each call and report it to :meth:`observe`
    learns: ClassVar[bool] = False

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

        ``comm`` (optional, see the class doc) gives context: ranks per node
        for shape choices, a probed network, and a place to cache what a
        size-aware algorithm chose. Called collectively (every rank, same
        order), so implementations may communicate. Default: the one
        schedule for ``world_size``.
        """
        return self.schedule(world_size)

    def supports(self, collective: Collective) -> bool:
        """Whether :meth:`schedule` can build ``collective``. Default: all-reduce only."""
        return collective is Collective.ALL_REDUCE

    def refuse_unless_all_reduce(self, collective: Collective) -> None:
        """Raise :class:`ValueError` naming this algorithm where ``collective`` is not the
        all-reduce: the one check of an algorithm that builds nothing else."""
        if collective is not Collective.ALL_REDUCE:
            raise ValueError(f"{self.name} implements all_reduce only, not {collective.value}")

    def observe(self, comm, nbytes: int, started_s: float) -> bool:
        """After a call ran :meth:`select`'s schedule for ``nbytes`` (started at
        ``time.perf_counter()`` = ``started_s``): learn from it. Called only where
        :attr:`learns`, collectively. Returns whether :meth:`select` gives the same schedule
        on the next calls until :meth:`settled_counter`'s counter or :meth:`phase_timer`'s
        timer says otherwise, so that the caller may keep it
        (``commrt.collectives.memo``). Default: yes, nothing learned.
        """
        return True

    def settled_counter(self, comm, nbytes: int):
        """What counts the calls of a settled size's kept schedule, or None (default).

        ``commrt.collectives.memo`` calls its ``settled_call()`` after each call it runs
        without :meth:`select`; True there brings the next calls back to :meth:`observe`.
        """
        return None

    def phase_timer(self, comm, nbytes: int):
        """What times the calls of a phase of learning that runs one schedule, or None
        (default: no such phase now).

        Asked first where a schedule is kept; ``commrt.collectives.memo`` calls it after
        each call it runs without :meth:`select`, with the call's start
        (``time.perf_counter()``); True there brings the next calls back to
        :meth:`select` and :meth:`observe`. ``auto`` observes those calls as the full path
        would, so that learning's calls cost what settled ones do.
        """
        return None

    def on_network(self, network) -> "Algorithm":
        """This algorithm as it chooses on ``network`` (a :class:`commrt.sim.Network`):
        the simulator asks, so that an algorithm that chooses by the network
        (``auto``) chooses for the simulated one. Default: itself."""
        return self

    def sync_policy(self):
        """A :class:`commrt.sync.Policy` of the algorithm's own for GradientSync, or None
        (default) for the policy of its :attr:`family`. A family defined outside commrt
        returns its own here; algorithms shipped with commrt name a family instead."""
        return None

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
