"""Recursive halving-doubling all-reduce (Rabenseifner).

Reduce-scatter by recursive halving, then all-gather by recursive doubling:
2·log2(p) steps instead of the ring's 2(p-1), same bytes as the ring. When
p is not a power of two the q = 2^floor(log2 p) "core" ranks run it, and
each extra rank first folds its whole buffer into core rank (extra - q) and
gets the result back at the end (two more steps, more bytes for those ranks).
:class:`~commrt.algorithms.RecursiveDoubling` shares that fold and halves the
steps again for small buffers, at log2(p) times the bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.algorithms.fragments import fold_in, fold_out, split_core
from commrt.schedule import Collective, Op, OpKind, Schedule, Step
from commrt.sim.network import Link
from commrt.sim.pricing import halving_doubling_time


@dataclass(frozen=True)
class HalvingDoubling(Algorithm):
    """Rabenseifner's all-reduce: the ring's bytes in 2·log2 p steps.

    Example::

        >>> from commrt.algorithms import HalvingDoubling
        >>> HalvingDoubling().schedule(8).num_steps
        6
    """

    name = "halving_doubling"

    def closed_form(self, world_size: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
        """All-reduce seconds on one link class, by :func:`commrt.sim.pricing.halving_doubling_time`
        (what :func:`commrt.sim.closed_form` and ``auto`` price it with)."""
        return halving_doubling_time(world_size, nbytes, link, gamma)

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        if collective is not Collective.ALL_REDUCE:
            raise ValueError(f"{self.name} implements all_reduce only, not {collective.value}")
        ranks = participants(world_size, ranks)
        core, extras = split_core(ranks)
        q = len(core)
        steps: list[Step] = fold_in(core, extras, (0, q))
        rng = [(0, q)] * q
        d = q // 2
        while d >= 1:  # recursive halving: keep the half on my side of bit d
            ops, new = [], list(rng)
            for i in range(q):
                lo, hi = rng[i]
                mid = (lo + hi) // 2
                keep, give = ((lo, mid), (mid, hi)) if not i & d else ((mid, hi), (lo, mid))
                ops += [
                    Op(OpKind.SEND, core[i], core[i ^ d], *give),
                    Op(OpKind.RECV_REDUCE, core[i], core[i ^ d], *keep),
                ]
                new[i] = keep
            rng = new
            steps.append(Step.of(ops, "halving"))
            d //= 2
        d = 1
        while d < q:  # recursive doubling: swap what each side holds
            ops, new = [], list(rng)
            for i in range(q):
                j = i ^ d
                ops += [
                    Op(OpKind.SEND, core[i], core[j], *rng[i]),
                    Op(OpKind.RECV_COPY, core[i], core[j], *rng[j]),
                ]
                new[i] = (min(rng[i][0], rng[j][0]), max(rng[i][1], rng[j][1]))
            rng = new
            steps.append(Step.of(ops, "doubling"))
            d *= 2
        steps += fold_out(core, extras, (0, q))
        return Schedule(self.name, collective, world_size, ranks, q, tuple(steps))
