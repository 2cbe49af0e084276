"""Gradient synchronisation: :class:`GradientSync` and the families behind its seam.

* :mod:`commrt.sync.gradsync`: hooks, buckets, the progress thread, wait/step;
* :mod:`commrt.sync.policy`: the seam (:class:`Policy`, :class:`SyncContext`);
* :mod:`commrt.sync.families`: which policy serves which algorithm;
* :mod:`commrt.sync.allreduce`: the all-reduce family (ring, torus2d, auto, ...);
* :mod:`commrt.sync.buckets`, :mod:`commrt.sync.stats`: bucketing, per-step stats.
"""
from commrt.sync.gradsync import GradientSync
from commrt.sync.policy import Policy, SyncContext

__all__ = ["GradientSync", "Policy", "SyncContext"]
