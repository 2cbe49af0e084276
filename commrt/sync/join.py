"""Uneven inputs: ranks that run out of data shadow the others' steps (``GradientSync.join``).

As with ``torch.distributed.algorithms.Join`` for DDP, every rank wraps its
loop in ``with sync.join(optimizer):``. A rank whose data ends leaves the
block and then *shadows* the steps the others still run: it sends zero
gradients, takes the average like everyone, and applies it with its own
optimizer, so its parameters and optimizer state stay identical to the
others'. The average is over the ranks still training at that step: each
step starts with one small sum all-reduce of "do I still train?"
(:meth:`JoinCount.count`, run by the family's policy before bucket 0), and
the pack pass scales by one over that count. When the count reaches zero
every rank has run out: that step applies nothing, and ``join`` returns on
every rank at the same step.

Which families take part is the policy's decision (:meth:`Policy.join
<commrt.sync.policy.Policy.join>`): the all-reduce family does; gossip and
backup workers say why not.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from commrt.algorithms import Ring


class JoinCount:
    """How many ranks still train, agreed at the start of every step of a join."""

    def __init__(self, ctx):
        self.ctx = ctx
        p = ctx.comm.world_size
        #: this rank's vote, then the sum of all votes (exact in float32 below 2**24 ranks)
        self.flag = torch.zeros(1, dtype=torch.float32, device=ctx.comm.device)
        self.schedule = Ring().schedule(p)
        #: inside sync.join(): every step is counted
        self.on = False
        #: this rank still has data (False once it left the join block)
        self.training = True
        #: ranks still training in the current step (as of its count)
        self.active = p

    def begin(self) -> None:
        self.on, self.training, self.active = True, True, self.ctx.comm.world_size

    def end(self) -> None:
        self.on, self.training = False, True

    def count(self) -> int:
        """Collective, on the progress thread before bucket 0 leaves: the ranks still
        training this step."""
        self.flag.fill_(1.0 if self.training else 0.0)
        self.ctx.run(self.schedule, self.flag, None)
        self.active = int(round(self.flag.item()))
        return self.active

    @property
    def all_joined(self) -> bool:
        """Every rank has run out of data (as of this step's count)."""
        return self.on and self.active == 0

    def scale(self, default: float) -> float:
        """The pack pass's factor: one over the ranks still training, inside a join."""
        return 1.0 / self.active if self.on and self.active > 0 else default


@contextlib.contextmanager
def joined(sync, count: JoinCount, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """``sync.join(optimizer)``: count every step while the caller trains; when it leaves
    the block, shadow steps (every gradient in as it stands: zeros after ``step()``) until
    the count says no rank trains any more. That last step applies nothing (the policy's
    ``apply`` returns 0), on every rank at once."""
    count.begin()
    try:
        yield
        count.training = False
        while True:
            sync.hooks.arrive_all()
            sync.step(optimizer)
            if count.all_joined:
                break
    finally:
        count.end()
