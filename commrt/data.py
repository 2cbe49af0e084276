"""Data for data-parallel training: :class:`GossipShuffle`, the distributed
sample shuffle of GossipGraD (``commrt.data.GossipShuffle``)."""

from commrt.training.shuffle import GossipShuffle

__all__ = ["GossipShuffle"]
