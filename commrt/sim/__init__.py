"""The cost simulator: real :class:`~commrt.Schedule` objects under an α-β network.

Rooms, bottom up: :mod:`~commrt.sim.links` (link classes, per-step overheads),
:mod:`~commrt.sim.replay` (the replay of one schedule), :mod:`~commrt.sim.pricing`
(closed forms by algorithm type, :func:`estimate`, :func:`price_all`),
:mod:`~commrt.sim.network` (nodes and NICs; a network prices algorithms on itself),
:mod:`~commrt.sim.run` (:func:`simulate`), :mod:`~commrt.sim.gossip`
(:func:`simulate_gossip`), :mod:`~commrt.sim.stragglers` (delays, arrivals,
:func:`simulate_steps`, :func:`simulate_backup`) and :mod:`~commrt.sim.control`
(backup workers' control store: cost per global step,
:func:`~commrt.sim.control.control_cost`). The simulator sits above
:mod:`commrt.algorithms`: it takes instances or names (resolved by
:func:`commrt.algorithms.resolve`), and the algorithms never import it.

:func:`simulate` walks ``schedule.steps`` (the same lazily built
:class:`~commrt.schedule.Step` objects the executor runs) with numpy on each
step's ``kind/rank/peer/lo/hi`` arrays, so a 4096-rank ring (8190 steps of
8192 ops) takes about a second.

The model
---------
*Messages.* Every ``SEND`` op of a step is one message of ``bytes`` =
(its chunk range under :func:`~commrt.schedule.chunk_bounds`) × ``itemsize``.
Empty ranges send nothing (the executor skips them too). A message on a
link of class *c* takes ``α_c + β_c · load``, where ``load`` is the largest
number of bytes any resource it crosses carries in that step (the
"bottleneck resource" approximation of fair sharing):

* its own bytes;
* the bytes its sender injects on that class in the step, and the bytes its
  receiver takes in on that class (a rank's port is full duplex: sending
  and receiving overlap, two sends share it);
* inter-node, when a node has fewer NICs than ranks: the node's
  inter-node bytes out (in) divided by ``nics_per_node`` (the ranks share
  the NICs; one rank's traffic goes through one NIC at the inter-node β).
  With at least one NIC per rank (DGX H100: 8 and 8) each rank's inter-node
  port *is* its NIC, and the per-rank term above covers it.

*Link classes.* Ranks are placed on nodes in blocks (rank // ranks_per_node,
as ``mpiexec``/``torchrun`` place them); two ranks on one node talk over the
intra-node class (NVLink-like), others over the inter-node class
(InfiniBand-like).

*Time.* Each rank has a clock (its start time, 0 unless ``start_s`` is
given). A message starts when both its sender and its receiver have
reached the step (rendezvous; the receiver has posted its receive) and
ends ``α + β·load`` later; a rank leaves the step when all of its messages
ended. That is what the executor does: no barrier between steps, each rank
waits only on its own peers. With equal messages and equal start times it
is the same as bulk-synchronous steps (step time = the slowest message), so
the closed forms hold exactly:

* ring: ``2(p−1)α + 2(p−1)/p · nβ + (p−1)/p · nγ``
* halving-doubling (p a power of two): ``2·log2(p)·α + 2(p−1)/p · nβ + (p−1)/p · nγ``
* recursive doubling (p a power of two): ``log2(p)·(α + nβ + nγ)``
* 2D torus X×Y: ``2(X+Y−2)α + 2(p−1)/p · nβ + (p−1)/p · nγ``

(tests/unit/test_sim.py checks them within 1% for p up to 4096). Where one rank
per node talks off-node in a step (a ring or a torus row laid along the
nodes), the NIC term never binds and the step takes the inter-node α, β, as
in the closed form. Where several ranks of a node send off-node at once
through fewer NICs, their messages slow down in proportion.

*Reduction.* A rank that adds received bytes into its buffer spends
``γ`` (``Network.gamma_s_per_byte``) per byte after its messages of the
step arrived (0 by default: free). It is what separates recursive doubling
(adds the whole buffer every step) from the ring (adds 1/p of it per
step) when latency does not.

*Ranks on shared cores.* With a :class:`Overhead` on the network (the
probe measures one on CPU backends), a step also costs each rank CPU
time, which overlaps the wire: a message takes ``max(β·load, o)``, ``o``
the larger of its two ranks' overheads in the step (a shift step, an
exchange step, or a step with several messages: ``multi_s``). The
closed forms are then not used. Not modelled: overlap of a reduction with
later pieces, pipelining inside a message, protocol switches
(eager/rendezvous, NCCL LL/Simple), topology beyond node/NIC (switch
oversubscription), and contention between different steps.

Stragglers
----------
:func:`simulate_steps` samples many training steps: each rank computes for
``compute_s`` plus a random delay (:class:`Exponential`, :class:`LogNormal`,
:class:`Pareto`; seeded), then the collective runs. A synchronous step ends
when the collective ends, so it waits for the slowest rank. Per-rank arrival
times come from :func:`arrivals`; the aggregation that turns them into a
start time is a separate, small function: :func:`synchronous_start` waits
for every rank, :func:`first_n_start` for the first N of N+b (backup
workers); :func:`simulate_backup` samples such steps for several b at once.
The delays can be given by their mean (``Exponential.from_mean`` and the
same on :class:`LogNormal` and :class:`Pareto`).

Example::

    >>> from commrt import sim
    >>> net = sim.Network.h100_nvlink_ib()
    >>> r = sim.simulate("ring", 64, 256 << 20, network=net)    # 8 nodes of 8 ranks
    >>> round(r.time_s * 1e3, 2), r.num_steps
    (12.02, 126)
    >>> round(sim.simulate("torus2d", 64, 256 << 20, network=net).time_s * 1e3, 2)
    2.65
"""

from __future__ import annotations

from commrt.sim.gossip import DeadlineSim, GossipSim, simulate_gossip, simulate_gossip_deadline
from commrt.sim.network import GB, Link, Network, Overhead, fmt_bytes
from commrt.sim.pricing import (
    closed_form,
    estimate,
    halving_doubling_time,
    price_all,
    recursive_doubling_time,
    ring_time,
    torus_time,
)
from commrt.sim.replay import SimResult, StepCost
from commrt.sim.run import simulate
from commrt.sim.stragglers import (
    BackupStats,
    Delay,
    Exponential,
    LogNormal,
    NoDelay,
    Pareto,
    StragglerStats,
    arrivals,
    first_n_start,
    simulate_backup,
    simulate_steps,
    synchronous_start,
)

__all__ = [
    "Link",
    "Network",
    "Overhead",
    "SimResult",
    "StepCost",
    "simulate",
    "closed_form",
    "estimate",
    "price_all",
    "Exponential",
    "LogNormal",
    "Pareto",
    "NoDelay",
    "Delay",
    "arrivals",
    "synchronous_start",
    "first_n_start",
    "simulate_steps",
    "StragglerStats",
    "simulate_backup",
    "BackupStats",
    "ring_time",
    "halving_doubling_time",
    "recursive_doubling_time",
    "torus_time",
    "simulate_gossip",
    "DeadlineSim",
    "simulate_gossip_deadline",
    "GossipSim",
    "GB",
    "fmt_bytes",
]
