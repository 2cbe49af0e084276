"""Gradient synchronisation: :class:`GradientSync` and the families behind its seam.

* :mod:`commrt.sync.gradsync`: GradientSync itself: hooks, wait/step/no_sync, report;
* :mod:`commrt.sync.config`: its arguments, validated into one :class:`SyncConfig`;
* :mod:`commrt.sync.step_state`: what one step has seen so far (reset in one place);
* :mod:`commrt.sync.progress`: the progress thread and the bucket runner;
* :mod:`commrt.sync.grad_ready`: the autograd hooks that mark each gradient ready;
* :mod:`commrt.sync.buffers`: bucket buffers, pack and unpack (grads as bucket views);
* :mod:`commrt.sync.unused`: parameters without a gradient in a step;
* :mod:`commrt.sync.recording`: per-step stats and trace spans;
* :mod:`commrt.sync.report`: the family-neutral :class:`SyncReport` (``sync.report()``);
* :mod:`commrt.sync.policy`: the seam (:class:`Policy`, :class:`SyncContext`);
* :mod:`commrt.sync.families`: which policy serves which algorithm;
* :mod:`commrt.sync.allreduce`: the all-reduce family (ring, torus2d, auto, ...);
* :mod:`commrt.sync.backup`: the backup-workers family (first N of N + b gradients);
* :mod:`commrt.sync.gossip`: the gossip family (GossipGraD: one peer per step, and
  gossip with a deadline: its policies, messages, ledger, deaths and rotation);
* :mod:`commrt.sync.join`: uneven inputs (``GradientSync.join``);
* :mod:`commrt.sync.model_state`: every rank starts from rank 0's weights;
* :mod:`commrt.sync.snapshot`: parameters and optimizer state, bit for bit (a late
  rank's catch-up);
* :mod:`commrt.sync.buckets`, :mod:`commrt.sync.stats`: bucketing, per-step stats.
"""

from commrt.sync.gradsync import GradientSync
from commrt.sync.policy import Policy, SyncContext
from commrt.sync.report import SyncReport

__all__ = ["GradientSync", "Policy", "SyncContext", "SyncReport"]
