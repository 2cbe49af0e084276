"""Helpers for a training loop built on the runtime.

:mod:`commrt.training.shuffle` (``GossipShuffle``, public as
``commrt.data.GossipShuffle``), :mod:`commrt.training.recipe` (batch-size
control and label smoothing) and :mod:`commrt.training.trace` (Chrome-trace
timelines and NVTX ranges).
"""
