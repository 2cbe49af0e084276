"""The all-reduce family: every bucket is averaged over all ranks.

Ring, halving-doubling, the 2D torus, ``auto`` and any other algorithm
whose ``select`` yields an all-reduce schedule. The pack pass scales by
1/p, so the sum the schedule computes is the average. Inside
``GradientSync.join`` each step first counts the ranks still training
(:class:`~commrt.sync.join.JoinCount`) and scales by one over that count
instead, so ranks that ran out of data (sending zeros) leave the average
alone; once every rank has run out, nothing is sent.
"""

from __future__ import annotations

import torch

from commrt.sync.join import JoinCount
from commrt.sync.policy import Policy, SyncContext
from commrt.transports.base import average_factor
from commrt.tuning.hook_comm import HookComm


class AllReducePolicy(Policy):
    """Scale by 1/p, run ``algorithm.select(p, bucket bytes)`` on each bucket."""

    #: the count of ranks still training, made at the first sync.join()
    joining: JoinCount | None = None

    def setup(self, ctx: SyncContext) -> tuple[str, ...]:
        self.ctx = ctx
        comm = ctx.comm
        # Called collectively, in bucket order: size-aware algorithms may probe here.
        where = HookComm(comm)
        self.schedules = [
            self.algorithm.select(comm.world_size, b.numel * ctx.element_size, where)
            for b in ctx.buckets
        ]
        for schedule, buf in zip(self.schedules, ctx.buffers):
            ctx.warm(schedule, buf)
        self._scale = average_factor(comm.world_size)
        return tuple(s.name for s in self.schedules)

    def join(self) -> JoinCount:
        if self.joining is None:
            self.joining = JoinCount(self.ctx)
        return self.joining

    def begin_step(self, step: int) -> None:
        if self.joining is not None and self.joining.on:
            self.joining.count()

    def scale(self, step: int) -> float:
        if self.joining is None:
            return self._scale
        return self.joining.scale(self._scale)

    def apply(self, optimizer: torch.optim.Optimizer) -> int:
        if self.joining is not None and self.joining.all_joined:
            return 0  # the step that found every rank out of data: nothing to apply
        return super().apply(optimizer)

    def communicate(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        if self.joining is not None and self.joining.all_joined:
            return 0  # every rank sends zeros and knows it: nothing to average
        return self.ctx.run(self.schedules[bucket], buf, bucket)
