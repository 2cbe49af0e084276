"""The all-reduce family: every bucket is averaged over all ranks.

Ring, halving-doubling, the 2D torus, ``auto`` and any other algorithm
whose ``select`` yields an all-reduce schedule. The pack pass scales by
1/p, so the sum the schedule computes is the average.
"""

from __future__ import annotations

import torch

from commrt.sync.policy import Policy, SyncContext


class AllReducePolicy(Policy):
    """Scale by 1/p, run ``algorithm.select(p, bucket bytes)`` on each bucket."""

    def setup(self, ctx: SyncContext) -> tuple[str, ...]:
        self.ctx = ctx
        comm = ctx.comm
        # Called collectively, in bucket order: size-aware algorithms may probe here.
        self.schedules = [
            self.algorithm.select(comm.world_size, b.numel * ctx.element_size, comm)
            for b in ctx.buckets
        ]
        self._scale = 1.0 / comm.world_size
        return tuple(s.name for s in self.schedules)

    def scale(self, step: int) -> float:
        return self._scale

    def communicate(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        return self.ctx.run(self.schedules[bucket], buf, bucket)
