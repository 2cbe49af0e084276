"""One-shot and two-shot all-reduce: every rank talks to every other, directly.

Between ranks that share a node (one GPU, or GPUs with peer access) the cost of
a call is set by how many times a rank waits on another process, not by bytes
(``cuda_ipc``: an IPC-event round trip costs hundreds of µs on one GPU). These
two schedules wait on each peer once per phase:

* **one-shot**: each rank sends its whole buffer to every other and adds what
  it receives (one step, p − 1 messages of n bytes each way). A transport that
  reads the peers' buffers in place (``cuda_ipc``'s workspace) runs the step as
  one sum over the ranks in rank order, so every rank gets the same bits; an
  executor that adds as pieces arrive gets the sum within rounding.
* **two-shot**: a direct reduce-scatter (block ``i`` summed on rank ``i``), then
  a direct all-gather of the sums (two steps, the ring's 2(p − 1)/p · n bytes).
  Each block is summed once, by its owner, so every rank gets the same bits.

One-shot moves (p − 1) · n per rank and suits small buffers; two-shot suits
large ones. vLLM's custom all-reduce and PyTorch's symmetric memory offer the
same pair.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.algorithms.fragments import direct_all_gather, direct_reduce_scatter
from commrt.errors import named_keywords
from commrt.schedule import Collective, Schedule, Steps


@named_keywords
@dataclass(frozen=True)
class OneShot(Algorithm):
    """Every rank sends its whole buffer to every other and sums: one step.

    Example::

        >>> from commrt.algorithms import OneShot
        >>> s = OneShot().schedule(4)
        >>> s.num_steps, s.messages(), s.check().ok
        (1, 12, True)
    """

    name = "one_shot"

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        self.refuse_unless_all_reduce(collective)
        ranks = participants(world_size, ranks)
        # every "block" is the whole buffer: position i sends it to j, adds j's
        steps, _ = direct_reduce_scatter(ranks, [(0, 1)] * len(ranks), "exchange")
        return Schedule(self.name, collective, world_size, ranks, 1, steps)


@named_keywords
@dataclass(frozen=True)
class TwoShot(Algorithm):
    """A direct reduce-scatter, then a direct all-gather: two steps.

    Example::

        >>> from commrt.algorithms import TwoShot
        >>> s = TwoShot().schedule(4)
        >>> s.num_steps, s.messages(), s.check().ok
        (2, 24, True)
    """

    name = "two_shot"

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        self.refuse_unless_all_reduce(collective)
        ranks = participants(world_size, ranks)
        m = len(ranks)
        blocks = [(k, k + 1) for k in range(m)]
        rs, _ = direct_reduce_scatter(ranks, blocks)
        steps = Steps.chain([rs, direct_all_gather(ranks, blocks)])
        return Schedule(self.name, collective, world_size, ranks, m, steps)
