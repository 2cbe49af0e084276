"""Gossip steps under the network model: each step's one-peer exchange replayed on its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from commrt.algorithms.gossip import AUTO_WARMUP, auto_deadline
from commrt.sim.network import Network
from commrt.sim.run import simulate

__all__ = ["GossipSim", "simulate_gossip", "DeadlineSim", "simulate_gossip_deadline"]


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


@dataclass(frozen=True, eq=False)
class DeadlineSim:
    """Training steps of gossip with per-rank clocks (see :func:`simulate_gossip_deadline`)."""

    world_size: int
    deadline_s: float | None  # None: plain gossip, every rank waits for its partner
    step_s: np.ndarray = field(repr=False)  # every (step, rank)'s duration
    staleness: np.ndarray = field(repr=False)  # every applied message's staleness (steps)

    @property
    def mean_s(self) -> float:
        """Mean step time (the ranks' mean throughput)."""
        return float(self.step_s.mean())

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.step_s, 99))

    def stale_share(self, steps: int, at_least: bool = False) -> float:
        """Share of the applied messages ``steps`` late (``at_least``: that many or more)."""
        if not len(self.staleness):
            return 0.0
        hit = self.staleness >= steps if at_least else self.staleness == steps
        return float(hit.mean())


def simulate_gossip_deadline(
    gossip,
    world_size: int,
    nbytes: int,
    network: Network | None = None,
    *,
    compute_s: float = 0.0,
    delay=None,
    deadline_s: float | str | None = "auto",
    steps: int = 200,
    seed: int = 0,
) -> DeadlineSim:
    """``steps`` training steps of gossip, each rank on its own clock.

    Rank r is ready at ``ready = clock + compute_s + delay draw`` and sends; its
    partner's message lands at the partner's ``ready + x`` (x: one gossip
    exchange priced by :func:`simulate_gossip`). Plain gossip (``deadline_s``
    None) ends the step at ``max(ready + x, landing)``: a slow rank slows its
    partner, and through it everyone. With a deadline the wait ends by
    ``ready + deadline_s``; a message that lands later is applied at the
    first step of its receiver that ends after it, its *staleness* being the
    steps between. ``"auto"`` picks :func:`~commrt.algorithms.gossip.auto_deadline`
    from the exchange times of the first steps waited in full, as the runtime does.

    Example::

        >>> from commrt import sim
        >>> from commrt.algorithms import Gossip
        >>> slow = sim.Pareto.from_mean(0.005)
        >>> plain = sim.simulate_gossip_deadline(
        ...     Gossip(), 64, 1 << 20, compute_s=0.1, delay=slow, deadline_s=None)
        >>> late = sim.simulate_gossip_deadline(Gossip(), 64, 1 << 20, compute_s=0.1, delay=slow)
        >>> late.mean_s < plain.mean_s, plain.stale_share(0)
        (True, 1.0)
    """
    network = Network.h100_nvlink_ib() if network is None else network
    x = simulate_gossip(gossip, world_size, nbytes, network).mean_s
    rng = np.random.default_rng(seed)
    draw = (
        (lambda: np.zeros(world_size)) if delay is None else (lambda: delay.sample(rng, world_size))
    )
    if deadline_s == "auto":
        ready, _, land, _ = _run(gossip, world_size, x, compute_s, draw, None, AUTO_WARMUP)
        deadline_s = auto_deadline(np.maximum(land - ready, 0.0))  # landed before: at once
    _, ends, land_at, recv = _run(gossip, world_size, x, compute_s, draw, deadline_s, steps)
    start = np.vstack([np.zeros((1, world_size)), ends[:-1]])
    # the first step of the receiver that ends at or after the landing applies the message
    stale = []
    for r in range(world_size):
        # (never before the message's own step: a partner ahead of r is waited for there)
        applied = np.maximum(np.searchsorted(ends[:, r], land_at[:, r]), np.arange(steps))
        ok = (recv[:, r] != r) & (applied < steps)
        stale.append((applied - np.arange(steps))[ok])
    return DeadlineSim(world_size, deadline_s, ends - start, np.concatenate(stale))


def _run(gossip, p: int, x: float, compute_s: float, draw, deadline_s, steps: int):
    """Per (step, rank): when it was ready, when its step ended, when its partner's message
    landed and who that partner was."""
    clock = np.zeros(p)
    ready = np.empty((steps, p))
    ends = np.empty((steps, p))
    landed = np.empty((steps, p))
    recv = np.empty((steps, p), dtype=np.int64)
    for t in range(steps):
        _, src = gossip.peer_arrays(t, p)
        r = clock + compute_s + draw()
        land = r[src] + x
        end = np.maximum(r + x, land)
        if deadline_s is not None:
            end = np.maximum(r + x, np.minimum(land, r + deadline_s))
        ready[t], ends[t], landed[t], recv[t] = r, end, land, src
        clock = end
    return ready, ends, landed, recv
