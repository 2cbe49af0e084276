"""Recursive-doubling all-reduce: the fewest steps, for small buffers.

In step k every core rank swaps its *whole* buffer with the rank whose
position differs in bit k and adds what it gets, so after log2(p) steps
everyone holds the sum (MPICH's choice for short messages). Against
halving-doubling it halves the steps and multiplies the bytes by
log2(p)/2·p/(p−1): the winner wherever per-message latency α dominates,
which ``auto`` decides from the probed α and β.

When p is not a power of two the extras fold into the q = 2^floor(log2 p)
core ranks first and get the result back last, exactly as in
:mod:`commrt.algorithms.halving_doubling` (the same fragments).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.algorithms.fragments import fold_in, fold_out, pairwise_exchange, split_core
from commrt.errors import named_keywords
from commrt.schedule import Collective, Schedule


@named_keywords
@dataclass(frozen=True)
class RecursiveDoubling(Algorithm):
    """Latency-optimal all-reduce: log2 p steps (+2 to fold in extras), whole buffer each.

    Example::

        >>> from commrt.algorithms import RecursiveDoubling
        >>> RecursiveDoubling().schedule(8).num_steps, RecursiveDoubling().schedule(6).num_steps
        (3, 4)
    """

    name = "recursive_doubling"

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        self.refuse_unless_all_reduce(collective)
        ranks = participants(world_size, ranks)
        core, extras = split_core(ranks)
        whole = (0, 1)  # one chunk: every message carries the whole buffer
        steps = fold_in(core, extras, whole)
        d = 1
        while d < len(core):
            steps.append(pairwise_exchange(core, d, whole, "doubling"))
            d *= 2
        steps += fold_out(core, extras, whole)
        return Schedule(self.name, collective, world_size, ranks, 1, tuple(steps))
