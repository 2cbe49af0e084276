"""Gossip steps under the network model: each step's one-peer exchange replayed on its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from commrt.sim.network import Network
from commrt.sim.run import simulate

__all__ = ["GossipSim", "simulate_gossip"]


@dataclass(frozen=True, eq=False)
class GossipSim:
    """Per-step replay of gossip exchanges (see :func:`simulate_gossip`)."""

    world_size: int
    nbytes: int
    step_s: np.ndarray = field(repr=False)  # one per simulated step
    off_node: np.ndarray = field(repr=False)  # share of that step's messages that cross nodes

    @property
    def mean_s(self) -> float:
        return float(self.step_s.mean()) if len(self.step_s) else 0.0

    @property
    def off_node_share(self) -> float:
        return float(self.off_node.mean()) if len(self.off_node) else 0.0


def simulate_gossip(
    gossip,
    world_size: int,
    nbytes: int,
    network: Network | None = None,
    *,
    steps: Sequence[int] | None = None,
    itemsize: int = 4,
) -> GossipSim:
    """Replay the gossip exchange of each step in ``steps`` (default: two rotation periods).

    Each step is one :meth:`Gossip.schedule(p, step=t) <commrt.algorithms.Gossip.schedule>`:
    every rank sends ``nbytes`` to one peer, so a step costs one α plus
    n·β of the link class its messages take, and the slowest message sets
    it. ``off_node`` says which share of each step's messages leave their
    node (where rotation sends partners).

    Example::

        >>> from commrt import sim
        >>> from commrt.algorithms import Gossip
        >>> r = sim.simulate_gossip(Gossip(rotate=False), 64, 1 << 20)   # 8 nodes of 8
        >>> [round(float(t) * 1e6, 1) for t in r.step_s[:4]], r.off_node[:4].tolist()
        ([5.8, 5.8, 5.8, 29.8], [0.0, 0.0, 0.0, 1.0])
    """
    network = Network.h100_nvlink_ib() if network is None else network
    if world_size == 1:
        return GossipSim(1, int(nbytes), np.zeros(1), np.zeros(1))
    L = gossip.period_length(world_size)
    steps = range(2 * L) if steps is None else steps
    node = np.arange(world_size) // network.ranks_per_node
    times, off = [], []
    for t in steps:
        sched = gossip.schedule(world_size, step=t)
        times.append(simulate(sched, nbytes=nbytes, network=network, itemsize=itemsize).time_s)
        send, _ = gossip.peer_arrays(t, world_size)
        off.append(float(np.mean(node != node[send])))
    return GossipSim(world_size, int(nbytes), np.array(times), np.array(off))
