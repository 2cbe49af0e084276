""":func:`simulate`: a schedule or an algorithm replayed under a network.

The public entry to :func:`commrt.sim.replay.replay`: it checks the network and supplies
the default one (H100 nodes), which the replay itself cannot name: the network prices
algorithms through the replay, so the replay sits below it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from commrt.sim.network import Network
from commrt.sim.replay import SimResult, replay

__all__ = ["simulate"]


def simulate(
    algorithm_or_schedule,
    world_size: int | None = None,
    nbytes: int = 1 << 20,
    network: Network | None = None,
    *,
    itemsize: int = 4,
    start_s: Sequence[float] | np.ndarray | None = None,
) -> SimResult:
    """Replay a schedule under ``network``; return its time and per-step costs.

    ``algorithm_or_schedule``: a :class:`~commrt.Schedule`, an
    :class:`~commrt.algorithms.Algorithm` instance or a name (``"ring"``,
    ``"hd"``, ...); an algorithm is asked for ``select(world_size, nbytes)``,
    the same schedule ``commrt.all_reduce`` runs. A Schedule may be of any
    collective (reduce-scatter, all-gather, a subset of ranks); ``nbytes`` is the buffer
    size, a multiple of ``itemsize`` (the element size: chunks are cut in
    elements, as the executor cuts them). ``network`` defaults to
    :meth:`Network.h100_nvlink_ib`. ``start_s`` (one per rank) lets ranks
    enter the collective at different times (stragglers); each rank then
    proceeds as soon as its own peers are ready.
    """
    network = Network.h100_nvlink_ib() if network is None else network
    if not isinstance(network, Network):
        raise TypeError(f"network must be a commrt.sim.Network, got {type(network).__name__}")
    return replay(
        algorithm_or_schedule, world_size, nbytes, network, itemsize=itemsize, start_s=start_s
    )
