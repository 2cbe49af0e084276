"""The gossip family (GossipGraD): each bucket is mixed with ONE peer per step.

At step ``t`` the pack pass scales every gradient by ½ and each bucket runs
:meth:`Gossip.schedule(p, step=t) <commrt.algorithms.Gossip.schedule>`:
send the bucket to ``send_to``, add the bucket of ``recv_from``. After
``wait()`` a rank's gradient is ½ own + ½ that of ``peers(rank, t, p)[1]``:
one message per bucket per step whatever p is (one per ``piece_bytes``
piece for buckets larger than the communicator's pieces, 4 MiB by
default). The peers depend on the step only, never on the bucket, so all
buckets of a step mix with the same rank. With p = 1 nothing moves and the
gradient is the rank's own.

``Gossip(asynchronous=True)``: step t's exchange runs while step t+1's
forward and backward run, and its result is applied at step t+1:

* at step t's ``communicate`` the bucket (½ own gradient of step t) is
  swapped with a policy-owned buffer of the same size, which holds the
  mixed result of step t−1: the bucket then carries that result to
  ``.grad``, and the policy keeps step t's gradient where backward of step
  t+1 cannot touch it (gradients live inside the bucket buffers);
* after ``wait()`` returns, :meth:`after_step` runs step t's exchange on
  the policy's buffers on the progress thread, while the caller computes
  step t+1 (collectives issued between steps wait for it, as every
  after-step work);
* **staleness**: the update applied at step t is the mix of step t−1's
  gradients, which were computed on parameters one update older;
* **step 0** applies no update: there is no mixed gradient yet, its
  ``.grad`` is zero, and :meth:`GradientSync.step` skips the optimizer
  (it returns 0). Every step's gradient is applied exactly once, one step
  late, never twice; the last step's mix is still on the wire at
  ``close()`` and is dropped. (Calling ``wait()`` and ``optimizer.step()``
  yourself applies a zero gradient at step 0 instead, which an optimizer
  with weight decay or momentum state would feel.)
* **extra memory**: one buffer per bucket (the gradients' size in the wire
  dtype) plus a swap buffer of at most 1 Mi elements; reported in
  ``sync.stats.buffer_bytes``.
"""

from __future__ import annotations

import torch

from commrt.sync.policy import Policy, SyncContext

#: elements of the buffer that swaps a bucket with the policy's copy, piece by piece
SWAP_ELEMS = 1 << 20


def swap(a: torch.Tensor, b: torch.Tensor, tmp: torch.Tensor) -> None:
    """Exchange the contents of ``a`` and ``b`` through ``tmp``, a piece at a time."""
    n = tmp.numel()
    for i in range(0, a.numel(), n):
        j = min(a.numel(), i + n)
        t = tmp[: j - i]
        t.copy_(a[i:j])
        a[i:j].copy_(b[i:j])
        b[i:j].copy_(t)


class GossipPolicy(Policy):
    """Scale by ½, run this step's one-peer exchange per bucket (see the module docs)."""

    # each rank mixes with one peer per step: models agree only at average_parameters
    models_drift = True

    def setup(self, ctx: SyncContext) -> tuple[str, ...]:
        self.ctx = ctx
        comm = ctx.comm
        self.world_size, self.rank = comm.world_size, comm.rank
        # a hypercube on a p that is not a power of two raises here, on every rank alike
        self.algorithm.period_length(self.world_size)
        self._scale = 0.5 if self.world_size > 1 else 1.0
        if self.world_size > 1:
            # each exchange adds the peer's bucket with the reduce kernel; on CUDA its first
            # launch per configuration compiles, which is done here rather than on the progress
            # thread during the first backward. Pieces depend on the bucket, not the step,
            # the peer or the rank, so step 0's schedule warms them all.
            schedule = self.algorithm.schedule(self.world_size, step=0)
            for buf in ctx.buffers:
                ctx.warm(schedule, buf)
        self._step = -1
        self._wire: list[torch.Tensor] = []
        self._tmp = None
        if self.algorithm.asynchronous:
            self._wire = [torch.zeros_like(b) for b in ctx.buffers]
            largest = max(b.numel() for b in ctx.buffers)
            self._tmp = torch.empty(
                min(largest, SWAP_ELEMS), dtype=ctx.comm_dtype, device=comm.device
            )
        return tuple(str(self.algorithm) for _ in ctx.buckets)

    def begin_step(self, step: int) -> None:
        self._step = step

    def scale(self, step: int) -> float:
        return self._scale

    def _exchange(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        if self.world_size == 1:
            return 0
        schedule = self.algorithm.schedule(self.world_size, step=step)
        # a rotated schedule is new every period: do not pin its binding to the buffer
        return self.ctx.run(schedule, buf, bucket, reused=not self.algorithm.rotate)

    def communicate(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        if not self.algorithm.asynchronous:
            return self._exchange(step, bucket, buf)
        swap(buf, self._wire[bucket], self._tmp)
        return 0

    def join(self):
        raise ValueError(
            "commrt: GradientSync.join() does not apply to gossip: each step mixes a rank's "
            "gradient with ONE peer's (half each), never an average over all ranks, so "
            "there is no count of ranks still training to divide by, and a finished rank's "
            "zero gradient would halve its partner's. Give every rank the same number of "
            "steps (drop the last uneven batches), or use an all-reduce algorithm"
        )

    def after_step(self, step: int) -> int:
        return sum(self._exchange(step, b, w) for b, w in enumerate(self._wire))

    def apply(self, optimizer: torch.optim.Optimizer) -> int:
        if self.algorithm.asynchronous and self._step == 0:
            return 0  # nothing mixed yet: step 0's gradient is applied (mixed) at step 1
        optimizer.step()
        return 1

    def step_stats(self) -> dict:
        mixed = self._step - 1 if self.algorithm.asynchronous else self._step
        if mixed < 0:
            return {"gossip_step": None}
        send, recv = self.algorithm.peers(self.rank, mixed, self.world_size)
        return {"gossip_step": mixed, "send_to": send, "recv_from": recv}

    @property
    def extra_bytes(self) -> int:
        held = self._wire + ([self._tmp] if self._tmp is not None else [])
        return sum(t.numel() * t.element_size() for t in held)
