"""GossipGraD (Daily et al., 2018): each step a rank exchanges with ONE partner.

An all-reduce costs every rank Θ(log p) (or Θ(p)) messages per step; gossip
costs one. At step ``t`` rank ``r`` sends its buffer to ``send_to`` and adds
the buffer of ``recv_from`` (``peers(r, t, p)``). GradientSync scales by ½ in
the pack pass, so after the exchange a rank holds ½ own + ½ its peer's
gradient (:mod:`commrt.sync.gossip`).

Partners are a pure function of (rank, step, world size, seed) -- no
messages, every rank computes the same answer -- on *virtual* ranks:

* ``hypercube`` (p a power of two): with L = log2 p and k = t mod L, virtual
  rank v pairs with v XOR 2^k, so ``send_to == recv_from``. Repeated ½/½
  mixing over L consecutive steps of one period averages a vector exactly:
  every update reaches everybody within log2 p steps.
* ``dissemination`` (any p): with L = ⌈log2 p⌉ and k = t mod L, v sends to
  v + 2^k and receives from v − 2^k (mod p). For p not a power of two the
  average is not exact after L steps, but disagreement shrinks
  geometrically (by 4× per period at p = 3; see tests/unit/test_gossip.py).

**Hypercube on a p that is not a power of two raises ValueError** (from
:meth:`Gossip.peers` and :meth:`Gossip.schedule`, hence on every rank when
GradientSync is built, before any gradient moves); it never silently falls
back. Use ``topology="dissemination"`` there.

**Rotation** (``rotate=True``): virtual rank = ``perm[rank]`` where ``perm``
is a permutation of range(p) drawn from ``(seed, period)``, period = t // L,
with a local numpy Generator (no global RNG state). Within a period the
fixed cube mixes exactly; across periods ranks also meet partners the
fixed cube never gives them. ``p = 1``: no exchange (``peers`` returns the
rank itself and the schedule has no steps).

**Deadline** (``deadline_s``): off (None) by default, which is the
exchange above, bit for bit. With a number of seconds (or ``"auto"``)
GradientSync never waits past the deadline for a partner's message: a
late message is applied when it arrives, at a later step, with push-sum
weights so every gradient reaches the model exactly once in total
(:mod:`commrt.sync.gossip.deadline`).

**Dead ranks** (``live=``): a partner outside the live set is replaced by
the rank itself (no exchange that step), so the schedule stays a pure
function of (rank, step, seed, live set) and the pairs among survivors
never change when a rank dies: survivors agree without a message.

Example::

    >>> from commrt.algorithms import Gossip
    >>> g = Gossip(topology="hypercube", rotate=False)
    >>> [g.peers(0, t, 8) for t in range(3)]
    [(1, 1), (2, 2), (4, 4)]
    >>> s = g.schedule(8, step=2)
    >>> s.num_steps, s.messages(), s.check().ok
    (1, 8, True)
    >>> [g.peers(0, t, 8, live={0, 2, 3, 4, 5, 6, 7}) for t in range(3)]  # rank 1 died
    [(0, 0), (2, 2), (4, 4)]
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from commrt import settings
from commrt.algorithms.base import Algorithm, participants
from commrt.errors import named_keywords
from commrt.schedule import RECV_REDUCE, SEND, Collective, Schedule, Step

__all__ = ["Gossip", "Topology", "auto_deadline"]

#: ``deadline_s="auto"``: letters waited for in full (as plain gossip) before the first
#: measured deadline
AUTO_WARMUP = 8
#: ``deadline_s="auto"``: the deadline is this multiple of the median exchange time ...
AUTO_FACTOR = 4.0
#: ... over this many of the latest exchanges ...
AUTO_WINDOW = 64
AUTO_MIN_S = settings.Seconds(
    2e-3,
    "the least automatic gossip deadline (4 × the median exchange time otherwise)",
    "`--gossip-deadline auto`",
    settings.AUTO,
)


def auto_deadline(latencies) -> float:
    """The deadline ``"auto"`` picks from measured exchange times (seconds from posting a
    message to its partner's landing): :data:`AUTO_FACTOR` × their median, at least
    :data:`AUTO_MIN_S`. The median ignores a straggler met in fewer than half the steps.

    >>> auto_deadline([0.001, 0.002, 0.003, 5.0])
    0.01
    """
    return max(AUTO_MIN_S, AUTO_FACTOR * float(np.median(np.asarray(latencies, dtype=float))))


_PAIR = np.array([1, 0], dtype=np.int64)
_PAIR.setflags(write=False)


class Topology(enum.Enum):
    HYPERCUBE = "hypercube"
    DISSEMINATION = "dissemination"


@named_keywords
@dataclass(frozen=True)
class Gossip(Algorithm):
    """One-peer gossip (see the module docs for the partner rules).

    Args:
        topology: ``"hypercube"`` (p a power of two) or ``"dissemination"`` (any p).
        rotate: draw a new virtual-rank permutation every period of L steps.
        seed: seeds the permutations (a non-negative integer; every rank must
            pass the same one).
        asynchronous: in GradientSync, run step t's exchange while step t+1
            computes and apply its result at step t+1 (one step stale; see
            :mod:`commrt.sync.gossip`).
        deadline_s: None (off: wait for every partner, today's exchange), seconds
            (> 0), or ``"auto"`` (a multiple of the median measured exchange time):
            never wait longer for a partner's message; a late one is applied when it
            arrives (see :mod:`commrt.sync.gossip.deadline`).
    """

    topology: Topology | str = Topology.HYPERCUBE
    rotate: bool = True
    seed: int = 0
    asynchronous: bool = False
    deadline_s: float | str | None = None
    name = "gossip"

    @property
    def family(self) -> str:
        """``"gossip"``; ``"gossip-deadline"`` with a deadline (its own GradientSync policy)."""
        return "gossip" if self.deadline_s is None else "gossip-deadline"

    def __post_init__(self):
        try:
            topo = (
                Topology(self.topology)
                if not isinstance(self.topology, Topology)
                else self.topology
            )
        except ValueError:
            raise ValueError(
                f"topology must be 'hypercube' or 'dissemination', got {self.topology!r}"
            ) from None
        object.__setattr__(self, "topology", topo)
        for flag in ("rotate", "asynchronous"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, (int, np.integer))
            or self.seed < 0
        ):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        d = self.deadline_s
        if d is not None and d != "auto":
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d < float("inf"):
                raise ValueError(
                    f"deadline_s must be None, 'auto' or a positive number of seconds, got {d!r}"
                )

    def supports(self, collective: Collective) -> bool:
        return collective is Collective.GOSSIP

    # ----------------------------------------------------------------- peers
    def period_length(self, world_size: int) -> int:
        """L: steps per rotation period (log2 p, or ⌈log2 p⌉ for dissemination); 1 for p = 1.

        Raises ValueError for a hypercube on p not a power of two."""
        if not isinstance(world_size, (int, np.integer)) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if self.topology is Topology.HYPERCUBE and world_size & (world_size - 1):
            raise ValueError(
                f"hypercube gossip needs a power-of-two number of ranks, got {world_size}; "
                f"use Gossip(topology='dissemination'), which handles any p"
            )
        return max(1, (int(world_size) - 1).bit_length())

    @functools.lru_cache(maxsize=64)
    def _permutation(self, world_size: int, period: int) -> tuple[np.ndarray, np.ndarray]:
        """(virtual rank of each position, position of each virtual rank) for one period."""
        if self.rotate:
            virt = np.random.default_rng([int(self.seed), period]).permutation(world_size)
        else:
            virt = np.arange(world_size)
        real = np.empty_like(virt)
        real[virt] = np.arange(world_size)
        virt.setflags(write=False)
        real.setflags(write=False)
        return virt, real

    def peer_arrays(self, step: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(send_to, recv_from)`` of every rank 0..p-1 at ``step``, as int arrays."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        L = self.period_length(world_size)
        if world_size == 1:
            return np.zeros(1, np.int64), np.zeros(1, np.int64)
        if world_size == 2:  # every permutation pairs the two ranks: skip drawing one
            return _PAIR, _PAIR
        k, period = int(step) % L, int(step) // L
        virt, real = self._permutation(int(world_size), period)
        if self.topology is Topology.HYPERCUBE:
            partner = real[virt ^ (1 << k)].astype(np.int64, copy=False)
            return partner, partner
        return (
            real[(virt + (1 << k)) % world_size].astype(np.int64, copy=False),
            real[(virt - (1 << k)) % world_size].astype(np.int64, copy=False),
        )

    def peers(self, rank: int, step: int, world_size: int, live=None) -> tuple[int, int]:
        """``(send_to, recv_from)`` of ``rank`` at ``step``: pure, no messages.

        ``(rank, rank)`` when ``world_size == 1`` (no exchange). ``live``: the ranks
        still alive (None: all); a partner outside it is replaced by ``rank`` itself,
        meaning no send or no receive that step."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        send, recv = self.peer_arrays(step, world_size)
        send, recv = int(send[rank]), int(recv[rank])
        if live is not None:
            send = send if send in live else rank
            recv = recv if recv in live else rank
        return send, recv

    # -------------------------------------------------------------- schedule
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.GOSSIP,
        step: int = 0,
    ) -> Schedule:
        """Step ``step``'s exchange as a one-step :class:`~commrt.Schedule` over one chunk.

        Every rank sends the whole buffer to its ``send_to`` and adds what
        arrives from its ``recv_from`` (``ranks`` restricts it to a subset,
        whose positions play the ranks 0..m-1 of :meth:`peers`). The
        schedule's ``sources`` names each rank's scheduled peer, which the
        checker verifies: each rank ends with its own contribution plus
        exactly that peer's.
        """
        if collective is not Collective.GOSSIP:
            raise ValueError(f"gossip implements the gossip exchange only, not {collective.value}")
        ranks = participants(world_size, ranks)
        send, recv = self.peer_arrays(step, len(ranks))
        k = int(step) % self.period_length(len(ranks))
        # Keyed on the pairing, not the step: a pairing seen before (always so at p = 2, often
        # at small p, every period without rotation) returns the same Schedule object, so the
        # executor's compiled plan and bound transport requests are reused too.
        return self._schedule(world_size, ranks, k, send.tobytes(), recv.tobytes())

    @functools.lru_cache(maxsize=256)
    def _schedule(
        self, world_size: int, ranks: tuple[int, ...], k: int, send: bytes, recv: bytes
    ) -> Schedule:
        m = len(ranks)
        r = np.asarray(ranks, dtype=np.int32)
        if m == 1:
            return Schedule(self.name, Collective.GOSSIP, world_size, ranks, 1, (), sources=ranks)
        send, recv = np.frombuffer(send, np.int64), np.frombuffer(recv, np.int64)
        kind = np.tile(np.array([SEND, RECV_REDUCE], np.int8), m)
        rank = np.repeat(r, 2)
        peer = np.empty(2 * m, np.int32)
        peer[0::2], peer[1::2] = r[send], r[recv]
        label = f"cube dim {k}" if self.topology is Topology.HYPERCUBE else f"dissem ±{1 << k}"
        st = Step(kind, rank, peer, np.zeros(2 * m, np.int64), np.ones(2 * m, np.int64), label)
        return Schedule(
            self.name,
            Collective.GOSSIP,
            world_size,
            ranks,
            1,
            (st,),
            sources=tuple(int(x) for x in r[recv]),
        )

    def select(self, world_size: int, nbytes: int, comm=None) -> Schedule:
        raise ValueError(
            "gossip is not an all-reduce: use it in commrt.GradientSync(algorithm=Gossip(...)); "
            "for an exact average of tensors use commrt.all_reduce or commrt.average_parameters"
        )

    def __str__(self) -> str:
        opts = (
            [self.topology.value]
            + (["rotate"] if self.rotate else [])
            + (["async"] if self.asynchronous else [])
            + ([f"deadline={self.deadline_s}"] if self.deadline_s is not None else [])
        )
        return f"gossip({','.join(opts)})"
