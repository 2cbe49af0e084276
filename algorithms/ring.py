"""Ring all-reduce: reduce-scatter then all-gather around one ring.

Bandwidth-optimal (each rank sends 2(p-1)/p of the buffer) with 2(p-1)
latency steps; the default for large buffers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.algorithms.fragments import ring_all_gather, ring_reduce_scatter
from commrt.errors import named_keywords
from commrt.schedule import Collective, Schedule, Steps


@named_keywords
@dataclass(frozen=True)
class Ring(Algorithm):
    """Ring all-reduce (also reduce-scatter and all-gather).

    Example::

        >>> from commrt.algorithms import Ring
        >>> Ring().schedule(4).num_steps
        6
    """

    name = "ring"

    def supports(self, collective: Collective) -> bool:
        return True

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        ranks = participants(world_size, ranks)
        m = len(ranks)
        blocks = [(k, k + 1) for k in range(m)]
        rs, holder = ring_reduce_scatter(ranks, blocks)
        owners = tuple(holder[k] for k in range(m))
        if collective is Collective.ALL_REDUCE:
            steps, owners = Steps.chain([rs, ring_all_gather(ranks, blocks)]), None
        elif collective is Collective.REDUCE_SCATTER:
            steps = rs
        else:
            steps = ring_all_gather(ranks, blocks)
        return Schedule(self.name, collective, world_size, ranks, m, steps, owners=owners)
