"""The cost simulator: real :class:`~commrt.Schedule` objects under an α-β network.

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

(tests/test_sim.py checks them within 1% for p up to 4096). Where one rank
per node talks off-node in a step (a ring or a torus row laid along the
nodes), the NIC term never binds and the step takes the inter-node α, β, as
in the closed form. Where several ranks of a node send off-node at once
through fewer NICs, their messages slow down in proportion.

*Reduction.* A rank that adds received bytes into its buffer spends
``γ`` (``Network.gamma_s_per_byte``) per byte after its messages of the
step arrived (0 by default: free). It is what separates recursive doubling
(adds the whole buffer every step) from the ring (adds 1/p of it per
step) when latency does not. Not modelled: overlap of a reduction with
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
workers).

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

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from commrt.schedule import RECV_REDUCE, SEND, Collective, Schedule, Step

__all__ = ["Link", "Network", "SimResult", "StepCost", "simulate", "closed_form", "estimate", "price_all",
           "Exponential", "LogNormal", "Pareto", "NoDelay", "arrivals", "synchronous_start",
           "simulate_steps", "StepStats", "ring_time", "halving_doubling_time",
           "recursive_doubling_time", "torus_time", "simulate_gossip", "GossipSim"]

GB = 1e9


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{int(n)} B"



# --------------------------------------------------------------------------
# network
# --------------------------------------------------------------------------

def _check_number(name: str, value, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be {'positive' if positive else 'non-negative'} and finite, got {value!r}")
    return v


@dataclass(frozen=True)
class Link:
    """One link class: ``alpha_s`` seconds per message, ``beta_s_per_byte`` per byte.

    Example::

        >>> Link.from_bandwidth(alpha_us=3, gbytes_per_s=370).bandwidth_gbps
        370.0
    """

    alpha_s: float
    beta_s_per_byte: float

    def __post_init__(self):
        object.__setattr__(self, "alpha_s", _check_number("alpha_s", self.alpha_s, positive=False))
        object.__setattr__(self, "beta_s_per_byte",
                           _check_number("beta_s_per_byte", self.beta_s_per_byte, positive=True))

    @classmethod
    def from_bandwidth(cls, alpha_us: float, gbytes_per_s: float) -> "Link":
        """A link from a latency in µs and a bandwidth in GB/s (10^9 bytes/s)."""
        bw = _check_number("gbytes_per_s", gbytes_per_s, positive=True)
        return cls(_check_number("alpha_us", alpha_us, positive=False) * 1e-6, 1.0 / (bw * GB))

    @property
    def bandwidth_gbps(self) -> float:
        """Bandwidth in GB/s (10^9 bytes/s)."""
        return round(1.0 / self.beta_s_per_byte / GB, 9)

    def time(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte


@dataclass(frozen=True)
class Network:
    """An α-β network with two link classes; frozen and validated.

    ``ranks_per_node`` consecutive ranks share a node; ``intra`` links them
    (NVLink-like), ``inter`` links nodes (InfiniBand-like), and a node's
    ``nics_per_node`` NICs carry all its inter-node traffic. ``inter.beta``
    is per NIC. With ``ranks_per_node=1`` every rank is its own node with
    its own NIC: a flat network with one link class.

    Presets: :meth:`h100_nvlink_ib` (published figures, sources in its
    docstring) and :meth:`from_probe` (measured here by :mod:`commrt.probe`:
    one class, or both when the ranks span nodes).
    """

    intra: Link
    inter: Link
    ranks_per_node: int = 1
    nics_per_node: int = 1
    name: str = "custom"
    #: seconds per byte a rank takes to add received data into its buffer
    gamma_s_per_byte: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "gamma_s_per_byte",
                           _check_number("gamma_s_per_byte", self.gamma_s_per_byte, positive=False))
        for f in ("intra", "inter"):
            if not isinstance(getattr(self, f), Link):
                raise TypeError(f"Network.{f} must be a Link, got {type(getattr(self, f)).__name__}")
        for f in ("ranks_per_node", "nics_per_node"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"Network.{f} must be a positive integer, got {v!r}")
            object.__setattr__(self, f, int(v))

    # presets -------------------------------------------------------------
    @classmethod
    def flat(cls, alpha_s: float, beta_s_per_byte: float, name: str = "flat") -> "Network":
        """One link class between every pair of ranks."""
        link = Link(alpha_s, beta_s_per_byte)
        return cls(link, link, 1, 1, name)

    @classmethod
    def from_probe(cls, alpha_s: float, beta_s_per_byte: float,
                   inter: tuple[float, float] | None = None, ranks_per_node: int = 1,
                   nics_per_node: int = 1, gamma_s_per_byte: float = 0.0) -> "Network":
        """The network :mod:`commrt.probe` measured: one class, or with ``inter`` = (α, β)
        between nodes of ``ranks_per_node`` ranks sharing ``nics_per_node`` NICs; ranks
        add received bytes at ``gamma_s_per_byte``."""
        intra = Link(alpha_s, beta_s_per_byte)
        if inter is None:
            return cls(intra, intra, 1, 1, "probe", gamma_s_per_byte)
        return cls(intra, Link(*inter), ranks_per_node, nics_per_node, "probe", gamma_s_per_byte)

    @classmethod
    def h100_nvlink_ib(cls, ranks_per_node: int = 8, nics_per_node: int = 8) -> "Network":
        """DGX/HGX H100 nodes: NVLink4 inside, NDR InfiniBand between (one NIC per GPU).

        Sources (figures as published; the latencies are assumptions):

        * intra β: 370 GB/s, the effective NVLink4 bandwidth NCCL reaches
          with the ring algorithm on 8×H100 (line rate 450 GB/s per
          direction, ~20% protocol overhead) -- S. Jeaugey (NVIDIA),
          https://github.com/NVIDIA/nccl-tests/issues/212 .
        * inter β: 48 GB/s per NIC, "for NDR @ 400Gbps you should see
          46-48GB/s per NIC" -- NVIDIA, https://github.com/NVIDIA/nccl-tests/issues/290 .
        * 8 NICs per node: DGX H100 has eight 400 Gb/s ConnectX-7 ports, one
          per GPU (NVIDIA DGX H100 user guide, hardware overview).
        * intra α = 3 µs, inter α = 8 µs: ASSUMPTIONS, per message,
          chosen from the per-hop latencies in NCCL's own cost model
          (src/graph/tuning.cc ``hwLat``: NVLink ring 0.6-3.4 µs by protocol,
          network 5-8.5 µs for LL/LL128; quoted in
          https://github.com/NVIDIA/nccl/issues/1334) plus a launch overhead.
          Change them with ``dataclasses.replace``.
        """
        return cls(Link.from_bandwidth(3.0, 370.0), Link.from_bandwidth(8.0, 48.0),
                   ranks_per_node, nics_per_node, "h100-nvlink-ndr")

    # helpers -------------------------------------------------------------
    def single_class(self, world_size: int) -> Link | None:
        """The one link every message uses for ``world_size`` ranks, or None if two classes are in play.

        True when every rank is its own node with its own NIC, or when all
        ranks fit in one node. (Node-level NIC sharing needs several ranks
        per node, so it never applies then.)
        """
        if world_size <= self.ranks_per_node:
            return self.intra
        if self.ranks_per_node == 1:
            return self.inter
        return None

    def describe(self) -> str:
        def link(l: Link) -> str:
            return f"α {l.alpha_s * 1e6:.3g} µs, {l.bandwidth_gbps:.4g} GB/s"
        add = f"; adds at {1e-9 / self.gamma_s_per_byte:.4g} GB/s" if self.gamma_s_per_byte else ""
        if self.ranks_per_node == 1:
            return f"{self.name}: flat, {link(self.inter)}{add}"
        return (f"{self.name}: {self.ranks_per_node} ranks/node, intra {link(self.intra)}; "
                f"inter {link(self.inter)} per NIC, {self.nics_per_node} NIC(s)/node{add}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Network":
        """From :meth:`to_dict` output, or a probe file ``{"alpha_s": .., "beta_s_per_byte": ..}``."""
        gamma = d.get("gamma_s_per_byte", 0.0)
        if "intra" in d:
            return cls(Link(**d["intra"]), Link(**d["inter"]), d.get("ranks_per_node", 1),
                       d.get("nics_per_node", 1), d.get("name", "custom"), gamma)
        if "alpha_s" in d and "beta_s_per_byte" in d:
            inter = d.get("inter_alpha_s"), d.get("inter_beta_s_per_byte")
            return cls.from_probe(d["alpha_s"], d["beta_s_per_byte"],
                                  None if None in inter else inter,
                                  d.get("ranks_per_node", 1), d.get("nics_per_node", 1), gamma)
        raise ValueError("a network file needs either intra/inter links (Network.to_dict()) "
                         "or alpha_s and beta_s_per_byte (a probe result)")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Network":
        with open(path) as f:
            return cls.from_dict(json.load(f))


# --------------------------------------------------------------------------
# closed forms
# --------------------------------------------------------------------------

def ring_time(p: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """Ring all-reduce: 2(p−1)α + 2(p−1)/p · nβ + (p−1)/p · nγ (γ: seconds per byte added)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.alpha_s + (p - 1) / p * nbytes * (2 * link.beta_s_per_byte + gamma)


def halving_doubling_time(p: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """Halving-doubling: 2·log2(q)·α + 2(q−1)/q · nβ + (q−1)/q · nγ on the q = 2^⌊log2 p⌋

    core ranks, plus, when p > q, the fold-in and fold-out of the whole buffer (2α + 2nβ + nγ).
    """
    if p <= 1:
        return 0.0
    q = 1 << (p.bit_length() - 1)
    t = 2 * math.log2(q) * link.alpha_s + (q - 1) / q * nbytes * (2 * link.beta_s_per_byte + gamma)
    if p > q:
        t += 2 * link.time(nbytes) + nbytes * gamma
    return t


def recursive_doubling_time(p: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """Recursive doubling: log2(q)·(α + nβ + nγ) on the q = 2^⌊log2 p⌋ core ranks (the whole

    buffer each step), plus, when p > q, the fold-in and fold-out of halving-doubling
    (2α + 2nβ + nγ).
    """
    if p <= 1:
        return 0.0
    q = 1 << (p.bit_length() - 1)
    fold = p > q
    return (math.log2(q) + 2 * fold) * link.time(nbytes) + (math.log2(q) + fold) * nbytes * gamma


def torus_time(rows: int, cols: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """2D torus all-reduce on X·Y ranks: 2(X+Y−2)α + 2(p−1)/p · nβ + (p−1)/p · nγ."""
    p = rows * cols
    if p <= 1:
        return 0.0
    per_byte = 2 * link.beta_s_per_byte + gamma
    return 2 * (rows + cols - 2) * link.alpha_s + (p - 1) / p * nbytes * per_byte


def closed_form(algorithm, world_size: int, nbytes: float, link: Link,
                gamma: float = 0.0) -> float | None:
    """The α-β(-γ) closed form for ``algorithm`` on one link class, or None if it has none.

    A :class:`~commrt.algorithms.Torus2D` without a shape is priced on the
    grid it picks without a communicator (the most square one).
    """
    from commrt.algorithms import HalvingDoubling, RecursiveDoubling, Ring, Torus2D, resolve
    alg = resolve(algorithm)
    if isinstance(alg, Ring):
        return ring_time(world_size, nbytes, link, gamma)
    if isinstance(alg, HalvingDoubling):
        return halving_doubling_time(world_size, nbytes, link, gamma)
    if isinstance(alg, RecursiveDoubling):
        return recursive_doubling_time(world_size, nbytes, link, gamma)
    if isinstance(alg, Torus2D):
        return torus_time(*alg.shape(world_size), nbytes, link, gamma)
    return None


def estimate(algorithm, world_size: int, nbytes: int, network: "Network", *, itemsize: int = 4) -> float:
    """Predicted all-reduce time: the closed form where one link class carries every
    message and the algorithm has one, else :func:`simulate` of its schedule."""
    link = network.single_class(world_size)
    if link is not None and not isinstance(algorithm, Schedule):
        t = closed_form(algorithm, world_size, nbytes, link, network.gamma_s_per_byte)
        if t is not None:
            return t
    return simulate(algorithm, world_size, nbytes, network=network, itemsize=itemsize).time_s


def price_all(algorithms: Sequence, world_size: int, nbytes: int, network: "Network", *, itemsize: int = 4,
              price=None) -> list[float | None]:
    """:func:`estimate` for each algorithm, skipping those that cannot be the fastest.

    Returns one entry per algorithm: its predicted time, or None when a
    lower bound (its closed form on a link with the network's smallest α
    and smallest β: no message can be faster) already exceeds the best time
    found. On a one-class network every closed form is exact and cheap, so
    nothing is skipped. ``price(alg)`` replaces :func:`estimate` (e.g. to
    share a memo).
    """
    price = price or (lambda a: estimate(a, world_size, nbytes, network, itemsize=itemsize))
    out: list[float | None] = [None] * len(algorithms)
    if network.single_class(world_size) is not None:
        return [price(a) for a in algorithms]
    fast = Link(min(network.intra.alpha_s, network.inter.alpha_s),
                min(network.intra.beta_s_per_byte, network.inter.beta_s_per_byte))
    bounds = []
    for a in algorithms:
        lb = closed_form(a, world_size, nbytes, fast, network.gamma_s_per_byte)
        bounds.append(0.0 if lb is None else lb * (1 - 1e-3))   # margin: chunk sizes round
    best = math.inf
    for i in sorted(range(len(algorithms)), key=lambda i: (bounds[i], i)):
        if bounds[i] > best:
            continue
        out[i] = price(algorithms[i])
        best = min(best, out[i])
    return out


# --------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class StepCost:
    """One row of :attr:`SimResult.steps`."""

    index: int
    phase: str
    time_s: float          # how much this step moved the finish of the slowest rank
    end_s: float           # when the last rank left this step
    slowest_message_s: float
    bytes: int             # sum over its messages
    messages: int


@dataclass(frozen=True, eq=False)
class SimResult:
    """What :func:`simulate` returns.

    ``time_s`` is when the slowest rank finished, measured from the earliest
    start (``start_s``, 0 unless per-rank start times were given);
    :attr:`steps` breaks it down per schedule step.
    """

    name: str
    world_size: int
    nbytes: int
    network: Network
    time_s: float
    collective: Collective = field(repr=False)
    start_s: float = field(repr=False)
    rank_finish_s: np.ndarray = field(repr=False)      # absolute, per rank (NaN: not a participant)
    step_phase: tuple[str, ...] = field(repr=False)
    step_end_s: np.ndarray = field(repr=False)         # absolute: last rank out of each step
    step_slowest_s: np.ndarray = field(repr=False)
    step_bytes: np.ndarray = field(repr=False)
    step_messages: np.ndarray = field(repr=False)

    @property
    def num_steps(self) -> int:
        return len(self.step_phase)

    @property
    def step_time_s(self) -> np.ndarray:
        """Per step: how much it moved the finish of the slowest rank (these sum to ``time_s``)."""
        if not self.num_steps:
            return np.zeros(0)
        ends = np.maximum.accumulate(np.maximum(self.step_end_s, self.start_s))
        return np.diff(ends, prepend=self.start_s)

    @property
    def steps(self) -> list[StepCost]:
        t = self.step_time_s
        return [StepCost(i, self.step_phase[i], float(t[i]), float(self.step_end_s[i]),
                         float(self.step_slowest_s[i]), int(self.step_bytes[i]), int(self.step_messages[i]))
                for i in range(self.num_steps)]

    def by_phase(self) -> dict[str, tuple[int, float]]:
        """phase -> (number of steps, time they added), in schedule order."""
        out: dict[str, list] = {}
        for ph, t in zip(self.step_phase, self.step_time_s.tolist()):
            e = out.setdefault(ph, [0, 0.0])
            e[0] += 1
            e[1] += t
        return {k: (n, t) for k, (n, t) in out.items()}

    @property
    def algbw_gbps(self) -> float:
        return self.nbytes / self.time_s / GB if self.time_s > 0 else float("inf")

    @property
    def busbw_gbps(self) -> float:
        """nccl-tests bus bandwidth: algbw × 2(p−1)/p for all-reduce, × (p−1)/p otherwise."""
        p = self.world_size
        if p <= 1:
            return self.algbw_gbps
        factor = 2 * (p - 1) / p if self.collective is Collective.ALL_REDUCE else (p - 1) / p
        return self.algbw_gbps * factor

    def table(self, max_steps: int = 12) -> str:
        """A readable breakdown: totals, per phase, then the first steps."""
        lines = [f"{self.name} · p={self.world_size} · {fmt_bytes(self.nbytes)} · {self.network.name}: "
                 f"{self.time_s * 1e6:.1f} µs (busbw {self.busbw_gbps:.1f} GB/s)"]
        for ph, (n, t) in self.by_phase().items():
            lines.append(f"  {ph or '(no phase)':<16} {n:6d} steps {t * 1e6:12.1f} µs")
        lines.append(f"  {'step':>6} {'phase':<16} {'+time(µs)':>11} {'slowest msg':>12} {'bytes':>12} {'msgs':>7}")
        for s in self.steps[:max_steps]:
            lines.append(f"  {s.index:6d} {s.phase:<16} {s.time_s * 1e6:11.2f} {s.slowest_message_s * 1e6:12.2f} "
                         f"{s.bytes:12d} {s.messages:7d}")
        if self.num_steps > max_steps:
            lines.append(f"  … {self.num_steps - max_steps} more steps")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _as_schedule(algorithm_or_schedule, world_size: int | None, nbytes: int, network: Network) -> Schedule:
    """A Schedule, an Algorithm instance or a name -> the schedule to replay."""
    if isinstance(algorithm_or_schedule, Schedule):
        s = algorithm_or_schedule
        if world_size is not None and world_size != s.world_size:
            raise ValueError(f"the schedule {s.name!r} is for world_size {s.world_size}, not {world_size}")
        return s
    from commrt.algorithms import resolve
    alg = resolve(algorithm_or_schedule)
    if world_size is None:
        raise ValueError("simulate() needs world_size when given an algorithm rather than a Schedule")
    from commrt.algorithms.auto import Auto
    if isinstance(alg, Auto) and alg.network is None:
        alg = Auto(network=network)          # let "auto" choose for the simulated network
    return alg.select(world_size, nbytes)


def _bounds(numel: int, num_chunks: int) -> np.ndarray:
    """chunk_bounds(numel, num_chunks) as an int64 array, vectorised."""
    base, extra = divmod(numel, num_chunks)
    c = np.arange(num_chunks + 1, dtype=np.int64)
    return c * base + np.minimum(c, extra)


class _Replayer:
    """Message times and the per-rank clock update of one step (see module doc)."""

    def __init__(self, schedule: Schedule, nbytes: int, network: Network, itemsize: int):
        if itemsize < 1:
            raise ValueError(f"itemsize must be a positive number of bytes, got {itemsize}")
        if nbytes < 0 or nbytes % itemsize:
            raise ValueError(f"nbytes must be a non-negative multiple of itemsize={itemsize}, got {nbytes}")
        self.bounds = _bounds(nbytes // itemsize, schedule.num_chunks) * itemsize   # byte offsets
        p = schedule.world_size
        self.p = p
        self.net = network
        self.single = network.single_class(p)
        rpn = network.ranks_per_node
        self.node = np.arange(p, dtype=np.int64) // rpn
        self.nnodes = int(self.node[-1]) + 1
        # With a NIC per rank a rank's port is its NIC: node-level sharing only when NICs are fewer.
        self.shared_nics = network.nics_per_node < rpn
        self.alpha = np.array([network.intra.alpha_s, network.inter.alpha_s])
        self.beta = np.array([network.intra.beta_s_per_byte, network.inter.beta_s_per_byte])
        self.gamma = network.gamma_s_per_byte

    def reduce_times(self, step: Step) -> np.ndarray | None:
        """Per rank: seconds spent adding what it received in ``step`` (None when γ = 0)."""
        if not self.gamma:
            return None
        red = np.flatnonzero(step.kind == RECV_REDUCE)
        hi, lo = self.bounds.take(step.hi.take(red)), self.bounds.take(step.lo.take(red))
        b = (hi - lo).astype(np.float64)
        return np.bincount(step.rank.take(red), b, self.p) * self.gamma

    def finish_step(self, clock: np.ndarray, step: Step) -> np.ndarray:
        """The clocks after ``step``'s messages (see :meth:`advance`) and its reductions."""
        src, dst, _, t = self.message_times(step)
        clock, _ = self.advance(clock, src, dst, t)
        extra = self.reduce_times(step)
        if extra is not None:
            clock = clock + (extra if clock.ndim == 1 else extra[:, None])
        return clock

    def message_times(self, step: Step) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, bytes, seconds) of the step's non-empty messages."""
        send = np.flatnonzero(step.kind == SEND)     # int indices: far cheaper than boolean masks
        src, dst = step.rank.take(send), step.peer.take(send)
        b = (self.bounds.take(step.hi.take(send)) - self.bounds.take(step.lo.take(send))).astype(np.float64)
        if not (b > 0).all():
            keep = np.flatnonzero(b > 0)
            src, dst, b = src.take(keep), dst.take(keep), b.take(keep)
        if not len(b):
            return src, dst, b, b
        p = self.p
        if self.single is not None:
            link = self.single
            load = np.maximum(b, np.maximum(np.bincount(src, b, p).take(src), np.bincount(dst, b, p).take(dst)))
            return src, dst, b, link.alpha_s + link.beta_s_per_byte * load
        # Two classes: per-rank ports are keyed (rank, class), so intra and inter traffic never share.
        ns, nd = self.node.take(src), self.node.take(dst)
        cls = (ns != nd).astype(np.int64)             # 0 intra-node, 1 inter-node
        ks, kd = src * 2 + cls, dst * 2 + cls
        load = np.maximum(b, np.maximum(np.bincount(ks, b, 2 * p).take(ks), np.bincount(kd, b, 2 * p).take(kd)))
        if self.shared_nics and cls.any():
            bi = b * cls
            nic = np.maximum(np.bincount(ns, bi, self.nnodes).take(ns),
                             np.bincount(nd, bi, self.nnodes).take(nd)) / self.net.nics_per_node
            load = np.where(cls == 1, np.maximum(load, nic), load)
        return src, dst, b, self.alpha.take(cls) + self.beta.take(cls) * load

    @staticmethod
    def advance(clock: np.ndarray, src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float]:
        """New clocks (shape (p,) or (p, samples)) after a step's messages, and the last message's end."""
        if not len(t):
            return clock, -np.inf
        if clock.ndim == 1:
            fin = np.maximum(clock.take(src), clock.take(dst)) + t
            new = clock.copy()
            np.maximum.at(new, src, fin)
            np.maximum.at(new, dst, fin)
            return new, float(fin.max())
        fin = np.maximum(clock[src], clock[dst]) + t[:, None]
        new = clock.copy()
        for idx in (src, dst):
            if len(np.unique(idx)) == len(idx):   # one message per rank: plain fancy indexing
                new[idx] = np.maximum(new[idx], fin)
            else:
                np.maximum.at(new, idx, fin)
        return new, float(fin.max())


def simulate(algorithm_or_schedule, world_size: int | None = None, nbytes: int = 1 << 20,
             network: Network | None = None, *, itemsize: int = 4,
             start_s: Sequence[float] | np.ndarray | None = None) -> SimResult:
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
    sched = _as_schedule(algorithm_or_schedule, world_size, nbytes, network)
    rp = _Replayer(sched, int(nbytes), network, int(itemsize))
    p = sched.world_size
    clock = np.zeros(p)
    if start_s is not None:
        start = np.asarray(start_s, dtype=np.float64)
        if start.shape != (p,):
            raise ValueError(f"start_s must hold one time per rank ({p}), got shape {start.shape}")
        if not np.all(np.isfinite(start)):
            raise ValueError("start_s must be finite")
        clock = start.copy()
    part = np.asarray(sched.ranks, dtype=np.int64)
    t0 = float(clock[part].min())
    n = sched.num_steps
    phase, end, slowest = [], np.empty(n), np.empty(n)
    nb, nm = np.empty(n, np.int64), np.empty(n, np.int64)
    for i, step in enumerate(sched.steps):
        src, dst, b, t = rp.message_times(step)
        clock, last = rp.advance(clock, src, dst, t)
        extra = rp.reduce_times(step)
        if extra is not None and extra.any():
            clock = clock + extra
            last = max(last, float(clock[extra > 0].max()))
        phase.append(step.phase)
        end[i] = last if len(t) else t0
        slowest[i] = t.max() if len(t) else 0.0
        nb[i], nm[i] = int(b.sum()), len(b)
    finish = np.full(p, np.nan)
    finish[part] = clock[part]
    return SimResult(sched.name, p, int(nbytes), network, float(finish[part].max() - t0), sched.collective, t0,
                     finish, tuple(phase), end, slowest, nb, nm)


# --------------------------------------------------------------------------
# gossip
# --------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class GossipSim:
    """Per-step replay of gossip exchanges (see :func:`simulate_gossip`)."""

    world_size: int
    nbytes: int
    step_s: np.ndarray = field(repr=False)       # one per simulated step
    off_node: np.ndarray = field(repr=False)     # share of that step's messages that cross nodes

    @property
    def mean_s(self) -> float:
        return float(self.step_s.mean()) if len(self.step_s) else 0.0

    @property
    def off_node_share(self) -> float:
        return float(self.off_node.mean()) if len(self.off_node) else 0.0


def simulate_gossip(gossip, world_size: int, nbytes: int, network: Network | None = None, *,
                    steps: Sequence[int] | None = None, itemsize: int = 4) -> GossipSim:
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


# --------------------------------------------------------------------------
# stragglers
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class NoDelay:
    """Every rank is on time."""

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        return np.zeros(size)

    @property
    def mean_s(self) -> float:
        return 0.0

    def __str__(self) -> str:
        return "no delay"


@dataclass(frozen=True)
class Exponential:
    """Delay ~ Exponential(mean ``mean_s``): memoryless jitter (OS noise, contention)."""

    mean_s: float

    def __post_init__(self):
        _check_number("Exponential.mean_s", self.mean_s, positive=False)

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        return rng.exponential(self.mean_s, size) if self.mean_s > 0 else np.zeros(size)

    def __str__(self) -> str:
        return f"exponential(mean {self.mean_s * 1e3:.3g} ms)"


@dataclass(frozen=True)
class LogNormal:
    """Delay = ``median_s`` · exp(σ·Z), Z ~ N(0, 1): multiplicative noise with a long tail."""

    median_s: float
    sigma: float = 1.0

    def __post_init__(self):
        _check_number("LogNormal.median_s", self.median_s, positive=False)
        _check_number("LogNormal.sigma", self.sigma, positive=False)

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        return self.median_s * np.exp(self.sigma * rng.standard_normal(size))

    @property
    def mean_s(self) -> float:
        return self.median_s * math.exp(self.sigma ** 2 / 2)

    def __str__(self) -> str:
        return f"lognormal(median {self.median_s * 1e3:.3g} ms, σ {self.sigma:g})"


@dataclass(frozen=True)
class Pareto:
    """Delay = ``scale_s`` · Lomax(``shape``) (Pareto II, starts at 0): a heavy tail,

    P(delay > x) = (1 + x/scale)^-shape. The mean is scale/(shape−1) for
    shape > 1; the smaller ``shape``, the heavier the tail.
    """

    scale_s: float
    shape: float = 2.0

    def __post_init__(self):
        _check_number("Pareto.scale_s", self.scale_s, positive=False)
        _check_number("Pareto.shape", self.shape, positive=True)

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        return self.scale_s * rng.pareto(self.shape, size)

    @property
    def mean_s(self) -> float:
        return self.scale_s / (self.shape - 1) if self.shape > 1 else float("inf")

    def __str__(self) -> str:
        return f"pareto(scale {self.scale_s * 1e3:.3g} ms, shape {self.shape:g})"


Delay = NoDelay | Exponential | LogNormal | Pareto


def arrivals(world_size: int, compute_s: float, delay: Delay | None, samples: int,
             seed: int | np.random.Generator = 0) -> np.ndarray:
    """When each rank is ready for the collective: ``compute_s`` + a delay draw.

    Shape ``(samples, world_size)``; deterministic for a given ``seed``.
    """
    if world_size < 1 or samples < 1:
        raise ValueError(f"world_size and samples must be positive, got {world_size} and {samples}")
    compute_s = _check_number("compute_s", compute_s, positive=False)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    d = (delay or NoDelay()).sample(rng, (samples, world_size))
    return compute_s + d


def synchronous_start(arrive: np.ndarray) -> np.ndarray:
    """When a synchronous collective can start: once the slowest rank arrived (max over ranks).

    Kept separate from :func:`simulate_steps` so that other aggregations
    (e.g. the N-th of N+b arrivals) can sit beside it.
    """
    return arrive.max(axis=-1)


def first_n_start(arrive: np.ndarray, n: int) -> np.ndarray:
    """When a backup-worker step can start: once the ``n``-th rank arrived (the first n of
    n + b; the b slowest are dropped). ``n`` = the number of ranks is :func:`synchronous_start`.

    Every rank starts each step afresh (as the paper's workers fetch new parameters); in
    commrt a very late worker first finishes its dropped gradient, so it may also miss the
    next step, which this leaves out.
    """
    p = arrive.shape[-1]
    if not 1 <= n <= p:
        raise ValueError(f"n must be between 1 and the number of ranks ({p}), got {n}")
    return np.partition(arrive, n - 1, axis=-1)[..., n - 1]


@dataclass(frozen=True, eq=False)
class StepStats:
    """Sampled synchronous training steps (see :func:`simulate_steps`)."""

    name: str
    world_size: int
    nbytes: int
    compute_s: float
    delay: Delay
    overlap: float
    collective_s: float            # the all-reduce alone, everyone on time
    step_s: np.ndarray = field(repr=False)      # one per sampled step
    wait_s: np.ndarray = field(repr=False)      # mean over ranks of (slowest arrival - own arrival)

    @property
    def ideal_s(self) -> float:
        """A step with no delays: compute, then the part of the collective not hidden by it."""
        return self.compute_s + (1 - self.overlap) * self.collective_s

    @property
    def mean_s(self) -> float:
        return float(self.step_s.mean())

    @property
    def p50_s(self) -> float:
        return float(np.percentile(self.step_s, 50))

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.step_s, 99))

    @property
    def slowdown(self) -> float:
        """Mean step time over the delay-free step time."""
        return self.mean_s / self.ideal_s if self.ideal_s > 0 else float("inf")

    def __str__(self) -> str:
        return (f"{self.name} p={self.world_size} {fmt_bytes(self.nbytes)} · compute {self.compute_s * 1e3:g} ms"
                f" · {self.delay}: mean {self.mean_s * 1e3:.3f} ms, p99 {self.p99_s * 1e3:.3f} ms "
                f"(ideal {self.ideal_s * 1e3:.3f} ms, ×{self.slowdown:.2f}); ranks wait "
                f"{self.wait_s.mean() * 1e3:.3f} ms on average")


def simulate_steps(algorithm_or_schedule, world_size: int | None = None, nbytes: int = 1 << 20,
                   network: Network | None = None, *, compute_s: float = 0.0, delay: Delay | None = None,
                   overlap: float = 0.0, samples: int = 1000, seed: int = 0, dataflow: bool = False,
                   itemsize: int = 4) -> StepStats:
    """Sample ``samples`` synchronous training steps with per-rank delays.

    Each rank computes for ``compute_s`` plus a draw from ``delay``
    (:func:`arrivals`), then the all-reduce of ``nbytes`` runs. ``overlap``
    (0..1) is the fraction of the collective hidden behind compute (bucketed
    gradients going out during backward); the step ends when the collective
    ends, minus that hidden part.

    ``dataflow=False`` (fast, any p): the collective starts when the slowest
    rank arrives (:func:`synchronous_start`) and takes its undelayed time.
    ``dataflow=True``: every sample is replayed through the schedule with
    per-rank start times (ranks begin as soon as their own peers are
    ready), which is what the executor does; it costs samples × a full
    replay, so keep p·samples moderate. Both wait for the slowest rank:
    an all-reduce result depends on every rank's data.
    """
    network = Network.h100_nvlink_ib() if network is None else network
    delay = NoDelay() if delay is None else delay
    overlap = _check_number("overlap", overlap, positive=False)
    if overlap > 1:
        raise ValueError(f"overlap must be between 0 and 1, got {overlap}")
    sched = _as_schedule(algorithm_or_schedule, world_size, nbytes, network)
    base = simulate(sched, nbytes=nbytes, network=network, itemsize=itemsize)
    p = sched.world_size
    arrive = arrivals(p, compute_s, delay, samples, seed)
    part = np.asarray(sched.ranks)
    arrive_part = arrive[:, part]
    start = synchronous_start(arrive_part)
    if dataflow:
        rp = _Replayer(sched, int(nbytes), network, int(itemsize))
        clock = np.zeros((p, samples))
        clock[part] = arrive_part.T
        for step in sched.steps:
            clock = rp.finish_step(clock, step)
        end = clock[part].max(axis=0)
    else:
        end = start + base.time_s
    step = end - overlap * base.time_s
    wait = (start[:, None] - arrive_part).mean(axis=1)
    return StepStats(sched.name, p, int(nbytes), compute_s, delay, overlap, base.time_s, step, wait)
