"""``algorithm="auto"``: pick the algorithm (and torus shape) per buffer size from the cost model.

Candidates: :class:`~commrt.algorithms.Ring`,
:class:`~commrt.algorithms.HalvingDoubling`,
:class:`~commrt.algorithms.RecursiveDoubling` and
:class:`~commrt.algorithms.Torus2D` on every grid ``rows × cols = p`` with
both sides at least 2. The network prices each (:meth:`commrt.sim.Network.price_all`,
that is :func:`commrt.sim.estimate`): the
α-β closed form when one link class carries every message (so for a probe
of ranks on one node), else a replay of its real schedule in the simulator
(so for a probe of ranks spanning nodes: both link classes, NIC sharing)
(skipping candidates whose lower bound already loses, see
:func:`commrt.sim.price_all`); the cheapest wins (ties go to the earlier
candidate in that order).

The network is ``Auto(network=...)`` if given, else measured on the
communicator at first use: ``comm.network()`` of the
:class:`commrt.tuning.hook_comm.HookComm` the collectives hand to :meth:`Auto.select`,
which runs :func:`commrt.tuning.probe.probe` (collective, tens of milliseconds, cached
in ``comm.slots``; see that module for what it sends). This module imports neither
the simulator nor the probe: both reach it through the objects it is given.
``select`` is called collectively (every rank, same order), and every rank
prices the candidates with the same agreed α and β, so all ranks choose the
same schedule.

The choice shows

* in the trace: the chosen schedule is renamed ``auto:<choice>``, e.g.
  ``auto:torus2d(4x16)``, and the executor names spans after it
  (``commrt/auto:ring/step3``); timeout errors name it too;
* in stats: :func:`choices` returns every :class:`Choice` made on a
  communicator (algorithm, predicted time, the other candidates' times).

Example::

    >>> from commrt.algorithms.auto import Auto
    >>> from commrt.sim import Network
    >>> net = Network.flat(alpha_s=20e-6, beta_s_per_byte=1 / 5e9)
    >>> Auto(network=net).choose(64, 1 << 10).label, Auto(network=net).choose(64, 1 << 28).label
    ('recursive_doubling', 'halving_doubling')
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import time
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.auto_cost import LearningCost
from commrt.algorithms.auto_learn import CONTENDERS, MARGIN, RECHECK_S, Tuning, agree
from commrt.algorithms.auto_recall import recalled, remember
from commrt.algorithms.base import Algorithm
from commrt.algorithms.halving_doubling import HalvingDoubling
from commrt.algorithms.one_shot import OneShot
from commrt.algorithms.pipelined_torus import PipelinedTorus2D
from commrt.algorithms.recursive_doubling import RecursiveDoubling
from commrt.algorithms.ring import Ring
from commrt.algorithms.torus import Torus2D
from commrt.errors import named_keywords
from commrt.schedule import Collective, Schedule

__all__ = ["Auto", "Choice", "choices", "candidates", "learning", "status"]
#: the most ranks auto considers the one-shot for (each rank sends to p − 1 others; the
#: anchors' one-shots stop at a node's 8 GPUs)
ONE_SHOT_RANKS = 8
#: the size :meth:`Auto.schedule` chooses for when no size is given: DDP's 25 MB bucket
DEFAULT_NBYTES = 25 << 20


def candidates(world_size: int, fused: bool = False) -> list[Algorithm]:
    """Ring, halving-doubling, recursive doubling, then every torus grid with both sides ≥ 2
    (rows ascending), then up to 64 ranks each grid pipelined in 4 and in 16 segments with
    ring columns (their replay costs ~S times the torus's: 0.5 s a size at p = 64, 3 s at
    128).

    ``fused``: the transport runs a one-shot all-reduce whole
    (:attr:`~commrt.transports.base.Traits.fuses_one_shot`, ``cuda_ipc``): then, up to
    :data:`ONE_SHOT_RANKS` ranks, the one-shot comes first. The model prices its steps,
    not the fusion (one wait per peer in place of a step's handshakes), so a tie goes to
    it; step by step it is no faster than recursive doubling, so it is left out there."""
    out: list[Algorithm] = [OneShot()] if fused and world_size <= ONE_SHOT_RANKS else []
    out += [Ring(), HalvingDoubling(), RecursiveDoubling()]
    tori = [
        Torus2D(r, world_size // r)
        for r in range(2, world_size // 2 + 1)
        if world_size % r == 0 and world_size // r >= 2
    ]
    out += tori
    out += [  # ring columns: on one link class they never beat the plain torus
        PipelinedTorus2D(t.rows, t.cols, s, False)
        for t in tori
        if world_size <= 64
        for s in (4, 16)
    ]
    return out


def label(alg: Algorithm) -> str:
    """``ring``, ``halving_doubling`` or ``torus2d(RxC)`` (ASCII: it goes into trace names)."""
    if isinstance(alg, Torus2D):
        return f"torus2d({alg.rows}x{alg.cols})"
    return str(alg)


class Prices(abc.ABC):
    """What :class:`Auto` asks of the network it chooses for. :class:`commrt.sim.Network`
    implements it; it is declared here because this module imports no simulator."""

    @abc.abstractmethod
    def estimate(self, algorithm, world_size: int, nbytes: int, *, itemsize: int = 4) -> float:
        """Predicted all-reduce seconds of ``algorithm`` on ``world_size`` ranks."""

    @abc.abstractmethod
    def price_all(
        self, algorithms: Sequence, world_size: int, nbytes: int, *, itemsize: int = 4
    ) -> list[float | None]:
        """:meth:`estimate` of each of ``algorithms``, None for one that provably cannot be
        the fastest."""


@dataclass(frozen=True)
class Choice:
    """One decision of :class:`Auto` for ``world_size`` ranks and ``nbytes``."""

    world_size: int
    nbytes: int
    algorithm: Algorithm
    label: str
    predicted_s: float
    candidates: tuple[tuple[str, float], ...]  # (label, predicted seconds), cheapest first;
    #                                              candidates that provably cannot win are left out
    network: Prices  # the commrt.sim.Network it was priced on
    schedule: Schedule = dataclasses.field(repr=False, compare=False)
    #: True when measurements replaced the model's choice by a candidate they tried (auto_learn)
    learned: bool = False
    #: whether the transport runs a one-shot whole (the one-shot was a candidate)
    fused: bool = False

    def __str__(self) -> str:
        others = ", ".join(f"{n} {t * 1e6:.1f}" for n, t in self.candidates[1:4])
        how = "learned: measured faster than the model's choice; " if self.learned else ""
        return (
            f"auto: {self.label} for {self.nbytes} B on {self.world_size} ranks "
            f"({how}predicted {self.predicted_s * 1e6:.1f} µs; next: {others} µs)"
        )


@named_keywords
@dataclass(frozen=True)
class Auto(Algorithm):
    """Chooses ring, halving-doubling or a torus shape per buffer size (module doc).

    ``network``: price candidates on this :class:`commrt.sim.Network`
    instead of probing the communicator's transport. ``calibration``: a
    file ``commrt probe --save`` wrote, loaded (and checked against the
    job) instead of probing. ``learn``: time the calls of
    ``commrt.all_reduce`` and replace a choice that misses its prediction
    by its runner-up if that measures faster (:mod:`commrt.algorithms.auto_learn`).
    ``recheck_s``: once a size has settled, time its kept schedule again after this many
    seconds of its calls (doubling while it stays the fastest), and meet the best rival
    again if it slowed; None never rechecks.

    Example::

        >>> commrt.all_reduce(t, comm, algorithm=Auto(recheck_s=None))  # doctest: +SKIP
    """

    network: Prices | None = None
    calibration: str | None = None
    learn: bool = True
    recheck_s: float | None = RECHECK_S

    name = "auto"
    learns = True

    def __post_init__(self):
        if self.network is not None and not isinstance(self.network, Prices):
            raise TypeError(
                f"Auto(network=...) takes a commrt.sim.Network, got {type(self.network).__name__}"
            )
        r = self.recheck_s
        if r is not None and (
            isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < math.inf
        ):
            raise ValueError(
                f"Auto(recheck_s=...) must be a positive number of seconds or None, got {r!r}"
            )

    def _network(self, comm):
        if self.network is not None:
            return self.network
        if comm is None:
            raise ValueError(
                "Auto needs a network to price algorithms on: run it through "
                "commrt.all_reduce (it probes the communicator) or give "
                "Auto(network=commrt.sim.Network...)"
            )
        # the probe (collective), through the HookComm the layer above handed down
        return comm.network(self.calibration)

    def on_network(self, network) -> "Auto":
        """This chooser, pricing on ``network`` unless it was given one: the simulator
        asks, so that ``simulate("auto", ...)`` chooses for the simulated network."""
        return self if self.network is not None else dataclasses.replace(self, network=network)

    def choose(self, world_size: int, nbytes: int, comm=None) -> Choice:
        """The cheapest candidate for ``nbytes`` on ``world_size`` ranks (cached on ``comm``)."""
        if comm is not None:  # a repeated call: one lookup (all_reduce's hot path)
            hit = comm.slots.auto_choices.get((self, world_size, nbytes))
            if hit is not None:
                return hit
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if nbytes < 0:
            raise ValueError(f"nbytes must be non-negative, got {nbytes}")
        store = comm.slots.auto_choices if comm is not None else None
        key = (self, world_size, int(nbytes))
        if store is not None and key in store:
            return store[key]
        network = self._network(comm)
        fused = comm is not None and comm.fuses_one_shot
        algs = candidates(world_size, fused) if world_size > 1 else [Ring()]
        itemsize = _itemsize(nbytes)
        times = network.price_all(algs, world_size, int(nbytes), itemsize=itemsize)
        priced = sorted((t, i, a) for i, (t, a) in enumerate(zip(times, algs)) if t is not None)
        table = tuple((label(a), s) for s, _, a in priced)
        choice = _choice(world_size, int(nbytes), priced[0][2], priced[0][0], table, network, fused)
        if store is not None:
            store[key] = choice
        return choice

    def select(self, world_size: int, nbytes: int, comm=None) -> Schedule:
        """The chosen schedule, named ``auto:<choice>``; probes ``comm`` on first use
        (collective). While the runner-up is on trial for this size, its schedule."""
        choice = self.choose(world_size, nbytes, comm)
        if comm is None or not self.learn or world_size < 2:
            return choice.schedule
        key = (self, world_size, int(nbytes))
        tuning = comm.slots.auto_tuning.get(key)
        if tuning is None:
            tuning = self._learn(comm, choice)
            comm.slots.auto_tuning[key] = tuning
            comm.slots.auto_tried[(*key, choice.label)] = choice  # the model's own, as it ran
        elif tuning.phase == "baseline" and tuning.calls == 0:
            # what learning costs is measured from here (a hold's end drops the memo, so the
            # baseline's first call always comes this way)
            tuning.cost.started(time.perf_counter())
        if tuning.running != choice.label:  # a tried candidate's turn in the trial
            return self._tried(comm, choice, tuning.running).schedule
        return choice.schedule

    def _learn(self, comm, choice: Choice) -> Tuning:
        """This size's learning: from an earlier job's verdict where there is one, else from
        the model's choice; paced at first as other sizes' phases measured learning's cost
        on ``comm`` (:class:`~commrt.algorithms.auto_cost.LearningCost`)."""
        key = (self, choice.world_size, choice.nbytes)
        probe = comm.slots.probe
        cost = LearningCost.like(
            [t.cost for k, t in comm.slots.auto_tuning.items() if k[:2] == key[:2]],
            None if probe is None else probe.alpha_s,
        )
        labels = _labels(choice.world_size, choice.fused)
        tuning = recalled(comm, key, choice, labels, cost, self.recheck_s)
        return tuning or self._tuning(choice, cost)

    def _tuning(self, choice: Choice, cost: LearningCost) -> Tuning:
        """Learning that starts from the model's choice, its runner-up on trial."""
        runner = _second(choice) and label(_second(choice))
        priced = dict(choice.candidates).get(runner)
        # those the model cannot tell from the choice, or from the runner-up it tries
        near = max(CONTENDERS * choice.predicted_s, (1 + MARGIN) * (priced or 0.0))
        others = tuple(n for n, t in choice.candidates[2:] if t <= near)
        return Tuning(
            choice.label,
            choice.predicted_s,
            runner,
            priced,
            others,
            dict(choice.candidates),
            recheck_after_s=self.recheck_s,
            cost=cost,
        )

    def observe(self, comm, nbytes: int, started_s: float) -> bool:
        """After ``commrt.all_reduce`` ran :meth:`select`'s schedule (started at
        ``time.perf_counter()`` = ``started_s``): time it, and at the end of a phase agree
        and decide (collective: every rank, same call; :mod:`~commrt.algorithms.auto_learn`).
        Returns whether the next call runs the schedule this one ran (the same on every
        rank, as the phase is): then the caller may keep it
        (``commrt.collectives.memo.SettledCall``): :meth:`phase_timer`'s timer observes the
        calls it runs so in a timed phase, :meth:`settled_counter`'s counter counts them in
        a settled or held one."""
        key = (self, comm.world_size, int(nbytes))
        tuning = comm.slots.auto_tuning.get(key)
        if tuning is None:
            return True
        if tuning.on_settled_path:  # past the memo (COMMRT_DEBUG): counted here
            again = tuning.settled_call()
            first = tuning.chosen_s is None and tuning.cost.settled_from_s is None
            if tuning.phase == "hold" and first:
                # the hold before the baseline: its period is timed from the end of its first
                # call (which compiled and bound the schedule) to the baseline's first
                tuning.cost.settled(time.perf_counter(), tuning.until_recheck)
            return not again
        if tuning.timing and comm.device.type == "cuda":
            comm.synchronize()  # NCCL calls return once enqueued: time the work itself
        done_s, ran = time.perf_counter(), tuning.running
        if not tuning.record(done_s - started_s):
            return tuning.running == ran  # a trial's block goes on, or the baseline's window
        table, costs = agree(comm, tuning, done_s)
        tuning.advance(table, costs)
        # the gather and the decision: on 2 cores at p = 2 over shm, 90 and 60 µs
        tuning.cost.gathered(time.perf_counter() - done_s)
        if tuning.phase != "settled":  # a hold of the leader, or the next phase or pass
            return tuning.running == ran
        current = comm.slots.auto_choices[key]
        if current.label != tuning.kept:  # learned, or back to the model's choice
            kept = self._tried(comm, current, tuning.kept)
            model = comm.slots.auto_remembered.get(key, tuning.choice)
            comm.slots.auto_choices[key] = dataclasses.replace(kept, learned=tuning.kept != model)
        remember(comm, tuning, nbytes, _labels(comm.world_size, comm.fuses_one_shot))
        return tuning.kept == ran

    def settled_counter(self, comm, nbytes: int) -> Tuning | None:
        """What counts the calls of a settled (or held) size's kept schedule toward its next
        recheck (or the hold's end): its :class:`Tuning` (``commrt.collectives.memo.counted``
        calls its ``settled_call()`` after each; None: nothing)."""
        return comm.slots.auto_tuning.get((self, comm.world_size, int(nbytes)))

    def phase_timer(self, comm, nbytes: int):
        """Where this size is in a phase that times one schedule (its baseline, a trial's
        block, a recheck): :func:`_timed` for it, which ``commrt.collectives.memo.counted``
        calls after each call the memo runs, with its start; else None."""
        tuning = comm.slots.auto_tuning.get((self, comm.world_size, int(nbytes)))
        if tuning is None or tuning.on_settled_path:
            return None
        return functools.partial(_timed, self, comm, int(nbytes), tuning)

    def _tried(self, comm, choice: Choice, name: str) -> Choice:
        """The Choice of candidate ``name``, priced as ``choice``'s candidates say; made once
        per communicator and size (a new schedule object every call of a trial would
        recompile its plan each time, a good part of a small call's time, and evict other
        plans from the executor's cache)."""
        key = (self, choice.world_size, choice.nbytes, name)
        hit = comm.slots.auto_tried.get(key)
        if hit is None:
            hit = comm.slots.auto_tried[key] = self._priced(choice, name)
        return hit

    def _priced(self, choice: Choice, name: str) -> Choice:
        p = choice.world_size
        alg = next(a for a in candidates(p, choice.fused) if label(a) == name)
        t = dict(choice.candidates).get(name)
        if t is None:  # left out of the table as a sure loser: priced now
            t = choice.network.estimate(alg, p, choice.nbytes, itemsize=_itemsize(choice.nbytes))
        return _choice(p, choice.nbytes, alg, t, choice.candidates, choice.network, choice.fused)

    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        """The choice for a 25 MiB buffer (DDP's bucket size) on ``Auto(network=...)``.

        Auto decides per buffer size, so without a size this picks for
        :data:`DEFAULT_NBYTES`; it needs ``network`` (there is no
        communicator to probe here) and raises ValueError otherwise.
        """
        if collective is not Collective.ALL_REDUCE:
            raise ValueError(
                f"{self.name} chooses all_reduce schedules only, not {collective.value}"
            )
        if self.network is None:
            raise ValueError(
                "Auto.schedule(world_size) has no buffer size and no communicator "
                "to probe: use Auto().select(world_size, nbytes, comm), or "
                "Auto(network=...).schedule(world_size)"
            )
        if ranks is None:
            return self.choose(world_size, DEFAULT_NBYTES).schedule
        m = len(tuple(ranks))
        best = self.choose(m, DEFAULT_NBYTES).algorithm
        sched = best.schedule(world_size, tuple(ranks))
        return dataclasses.replace(sched, name=f"auto:{label(best)}")


def _labels(p: int, fused: bool) -> tuple[str, ...]:
    """Every candidate's label at ``p`` ranks, in :func:`candidates`' order (the same on
    every rank: how the memory's shared row names them)."""
    return tuple(label(a) for a in candidates(p, fused))


def _itemsize(nbytes: int) -> int:
    return 4 if nbytes % 4 == 0 else 1


def _second(choice: Choice) -> Algorithm | None:
    """The model's second choice, even where pricing left it out as a sure loser (on the
    bound that the measurements just contradicted)."""
    others = [a for a in candidates(choice.world_size, choice.fused) if label(a) != choice.label]
    if len(choice.candidates) > 1:
        return next(a for a in others if label(a) == choice.candidates[1][0])
    if not others:
        return None
    p, n, net = choice.world_size, choice.nbytes, choice.network
    return min(others, key=lambda a: net.estimate(a, p, n, itemsize=_itemsize(n)))


def _choice(
    p: int, nbytes: int, alg: Algorithm, t: float, table, network, fused: bool = False
) -> Choice:
    sched = dataclasses.replace(alg.schedule(p), name=f"auto:{label(alg)}")
    return Choice(p, nbytes, alg, label(alg), t, table, network, sched, fused=fused)


def _timed(auto: Auto, comm, nbytes: int, tuning: Tuning, started_s: float) -> bool:
    """After a call the memo ran in a timed phase of ``tuning``'s size (``nbytes``), started
    at ``started_s``: observe it, as ``auto`` observes a call of the full path. True where
    the next call runs another schedule, or the size is now settled or held: the memo is
    dropped, and kept again with the size's counter (a settled call takes no time stamp)."""
    same = auto.observe(comm, nbytes, started_s)
    return not same or tuning.on_settled_path


def learning(comm) -> dict[int, Tuning]:
    """What ``auto`` learned on ``comm`` per buffer size in bytes (module
    :mod:`~commrt.algorithms.auto_learn`): phase, measured and predicted times, kept."""
    store = comm.slots.auto_tuning
    return {nbytes: t for (_, p, nbytes), t in store.items() if p == comm.world_size}


def choices(comm) -> dict[int, Choice]:
    """Every choice ``auto`` made on ``comm``, by buffer size in bytes (for stats and logs).

    Example::

        >>> for nbytes, c in choices(comm).items():              # doctest: +SKIP
        ...     print(nbytes, c.label, c.predicted_s)
    """
    store = comm.slots.auto_choices
    return {nbytes: c for (_, p, nbytes), c in store.items() if p == comm.world_size}


def status(comm, nbytes: int) -> tuple[str, str]:
    """What ``auto`` runs for calls of ``nbytes`` on ``comm``, and why: ``(row, note)`` for
    stats and logs, both from the same state so that they never disagree (``("", "")`` where
    auto chose nothing for that size).

    Settled: ``auto:<kept>`` and the :class:`Choice`'s own line. Still learning (or
    rechecking): ``auto:<label>``, where ``<label>`` is what it runs meanwhile, between its
    trial's blocks (the fastest measured so far, else the model's choice; never the
    candidate a block happens to be timing), and a note that starts ``auto: learning``
    (``auto: rechecking``), names it, and names what it is timing against it."""
    choice = choices(comm).get(nbytes)
    if choice is None:
        return "", ""
    tuning = learning(comm).get(nbytes)
    if tuning is None or tuning.phase == "settled":
        return f"auto:{choice.label}", str(choice)
    doing = "learning" if tuning.kept is None else "rechecking"
    now = tuning.kept if tuning.phase == "recheck" else tuning.leader  # what a hold runs
    rivals = [x for x in (tuning.live or tuning.rotation) if x != now]
    remembered = any(k[1:] == (choice.world_size, nbytes) for k in comm.slots.auto_remembered)
    began = "an earlier job kept {} at" if remembered else "the model chose {}, predicted"
    note = (
        f"auto: {doing} for {nbytes} B on {choice.world_size} ranks; runs {now} meanwhile "
        f"({began.format(tuning.choice)} {tuning.predicted_s * 1e6:.1f} µs)"
    )
    if rivals and tuning.phase != "baseline":
        note += f", timing {', '.join(rivals)} against it"
    return f"auto:{now}", note
