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
from commrt.errors import named_keywords
from commrt.schedule import Collective, Op, OpKind, Schedule, Step


@named_keywords
@dataclass(frozen=True)
class HalvingDoubling(Algorithm):
    """Rabenseifner's all-reduce: the ring's bytes in 2·log2 p steps.

    Example::

        >>> from commrt.algorithms import HalvingDoubling
        >>> HalvingDoubling().schedule(8).num_steps
        6
    """

    name = "halving_doubling"

    def supports(self, collective: Collective) -> bool:
        """All-reduce on any p; reduce-scatter and all-gather (the halving or the doubling
        half alone) where p is a power of two."""
        return collective in (
            Collective.ALL_REDUCE,
            Collective.REDUCE_SCATTER,
            Collective.ALL_GATHER,
        )

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        if not self.supports(collective):
            raise ValueError(f"{self.name} does not implement {collective.value}")
        ranks = participants(world_size, ranks)
        core, extras = split_core(ranks)
        q = len(core)
        if extras and collective is not Collective.ALL_REDUCE:
            raise ValueError(
                f"{self.name} {collective.value} needs a power-of-two number of ranks, "
                f"got {len(ranks)}; use Ring() or Torus2D() for this p"
            )
        halving, rng = _halving(core)
        owners = [0] * q
        for i, (lo, _hi) in enumerate(rng):
            owners[lo] = core[i]
        if collective is Collective.REDUCE_SCATTER:
            return Schedule(self.name, collective, world_size, ranks, q, halving, tuple(owners))
        doubling = _doubling(core, rng)
        if collective is Collective.ALL_GATHER:
            return Schedule(self.name, collective, world_size, ranks, q, doubling, tuple(owners))
        steps = fold_in(core, extras, (0, q)) + halving + doubling + fold_out(core, extras, (0, q))
        return Schedule(self.name, collective, world_size, ranks, q, tuple(steps))


def _halving(core: Sequence[int]) -> tuple[list[Step], list[tuple[int, int]]]:
    """Recursive halving over ``core``: each keeps the half on its side of bit d; returns
    the steps and the one-chunk range each core position ends with."""
    q = len(core)
    rng = [(0, q)] * q
    steps = []
    d = q // 2
    while d >= 1:
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
    return steps, rng


def _doubling(core: Sequence[int], rng: list[tuple[int, int]]) -> list[Step]:
    """Recursive doubling from the ranges ``rng`` each core position holds: swap what
    each side holds until everyone holds everything."""
    q = len(core)
    steps = []
    d = 1
    while d < q:
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
    return steps
