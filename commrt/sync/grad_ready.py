"""Gradient-ready hooks: autograd marks each parameter ready as its ``.grad`` is accumulated.

One post-accumulate-grad hook per trainable parameter tells the progress
thread (:class:`~commrt.sync.progress.ProgressThread`) that the parameter's
gradient is in; a bucket whose parameters are all in may leave. The first
gradient of a step hands the wire to the GradientSync
(``comm.syncs.begin_step``). Inside ``no_sync()`` the hooks do nothing.
"""

from __future__ import annotations

import time

import torch

from commrt.sync.buckets import Bucket
from commrt.sync.progress import ProgressThread


class GradReadyHooks:
    """The hooks of one GradientSync (``sync``), registered at construction."""

    def __init__(self, sync, buckets: list[Bucket], progress: ProgressThread, comm, named):
        self.sync, self.buckets, self.progress, self.comm = sync, buckets, progress, comm
        #: inside no_sync(): gradients accumulate locally, hooks do nothing
        self.accumulating = False
        #: id(parameter) -> its bucket
        self.where = {id(p): b.index for b in buckets for p in b.params}
        self.handles = [p.register_post_accumulate_grad_hook(self.on_grad) for _, p in named]

    def on_grad(self, p: torch.nn.Parameter) -> None:
        """Autograd accumulated ``p.grad``: count it in, hand its bucket over when complete."""
        if self.accumulating:
            return
        now = time.perf_counter()
        b = self.where[id(p)]
        progress = self.progress
        with progress.cv:
            if progress.error is not None:
                # a CommError in its own type (PeerClosedError, RankDeclaredDeadError, ...),
                # whichever thread saw it first: a caller may catch exactly that
                progress.raise_error()
            if id(p) in progress.state.seen:
                name = self.buckets[b].names[self.buckets[b].params.index(p)]
                raise RuntimeError(
                    f"commrt: parameter {name} got a second gradient before sync.wait(); its "
                    "bucket may already be on the wire. Call sync.wait() (or sync.step()) after "
                    "each backward, and wrap accumulation steps in sync.no_sync()."
                )
            if progress.arrived(b, id(p), now):
                self.comm.syncs.begin_step(self.sync)

    def arrive_all(self) -> None:
        """Count every parameter in, as it stands (a step of a rank that ran out of data:
        a parameter without ``.grad`` is sent as zeros)."""
        for bucket in self.buckets:
            for p in bucket.params:
                self.on_grad(p)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
