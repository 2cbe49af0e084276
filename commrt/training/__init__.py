"""Helpers for a training loop built on the runtime.

:mod:`commrt.training.shuffle` (``GossipShuffle``, public as
``commrt.data.GossipShuffle``) and :mod:`commrt.training.recipe` (batch-size
control and label smoothing).
"""
