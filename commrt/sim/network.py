"""The α-β network model: link classes laid out on nodes and NICs (:class:`Network`), and
what it prices: :meth:`Network.estimate` and :meth:`Network.price_all`, so that a holder
of a network (``Auto(network=...)``) prices algorithms without importing the simulator.

:class:`Link`, :class:`Overhead` and the number checks live in :mod:`commrt.sim.links`
(below the replay and the pricing, which this module builds on); they are importable
from here too.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from commrt.algorithms.auto import Prices
from commrt.sim import pricing
from commrt.sim.links import GB, Link, Overhead, check_number, fmt_bytes

__all__ = ["GB", "Link", "Network", "Overhead", "check_number", "fmt_bytes"]


@dataclass(frozen=True)
class Network(Prices):
    """An α-β network with two link classes; frozen and validated.

    ``ranks_per_node`` consecutive ranks share a node; ``intra`` links them
    (NVLink-like), ``inter`` links nodes (InfiniBand-like), and a node's
    ``nics_per_node`` NICs carry all its inter-node traffic. ``inter.beta``
    is per NIC. With ``ranks_per_node=1`` every rank is its own node with
    its own NIC: a flat network with one link class.

    Presets: :meth:`h100_nvlink_ib` (published figures, sources in its
    docstring) and :meth:`from_probe` (measured here by :mod:`commrt.tuning.probe`:
    one class, or both when the ranks span nodes).
    """

    intra: Link
    inter: Link
    ranks_per_node: int = 1
    nics_per_node: int = 1
    name: str = "custom"
    #: seconds per byte a rank takes to add received data into its buffer
    gamma_s_per_byte: float = 0.0
    #: per-step overheads where ranks share cores (None: every message pays α + β·load)
    overhead: Overhead | None = None

    def __post_init__(self):
        if self.overhead is not None and not isinstance(self.overhead, Overhead):
            raise TypeError(
                f"Network.overhead must be an Overhead or None, got {type(self.overhead).__name__}"
            )
        object.__setattr__(
            self,
            "gamma_s_per_byte",
            check_number("gamma_s_per_byte", self.gamma_s_per_byte, positive=False),
        )
        for f in ("intra", "inter"):
            if not isinstance(getattr(self, f), Link):
                raise TypeError(
                    f"Network.{f} must be a Link, got {type(getattr(self, f)).__name__}"
                )
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
    def from_probe(
        cls,
        alpha_s: float,
        beta_s_per_byte: float,
        inter: tuple[float, float] | None = None,
        ranks_per_node: int = 1,
        nics_per_node: int = 1,
        gamma_s_per_byte: float = 0.0,
        overhead: Overhead | None = None,
    ) -> "Network":
        """The network :mod:`commrt.tuning.probe` measured: one class, or with ``inter`` = (α, β)
        between nodes of ``ranks_per_node`` ranks sharing ``nics_per_node`` NICs; ranks
        add received bytes at ``gamma_s_per_byte`` and pay ``overhead`` per step."""
        intra = Link(alpha_s, beta_s_per_byte)
        if inter is None:
            return cls(intra, intra, 1, 1, "probe", gamma_s_per_byte, overhead)
        return cls(
            intra, Link(*inter), ranks_per_node, nics_per_node, "probe", gamma_s_per_byte, overhead
        )

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
        return cls(
            Link.from_bandwidth(3.0, 370.0),
            Link.from_bandwidth(8.0, 48.0),
            ranks_per_node,
            nics_per_node,
            "h100-nvlink-ndr",
        )

    # helpers -------------------------------------------------------------
    def single_class(self, world_size: int) -> Link | None:
        """The one link every message uses for ``world_size`` ranks, or None if two classes
        are in play.

        True when every rank is its own node with its own NIC, or when all
        ranks fit in one node. (Node-level NIC sharing needs several ranks
        per node, so it never applies then.)
        """
        if world_size <= self.ranks_per_node:
            return self.intra
        if self.ranks_per_node == 1:
            return self.inter
        return None

    # pricing ------------------------------------------------------------
    def estimate(self, algorithm, world_size: int, nbytes: int, *, itemsize: int = 4) -> float:
        """Predicted all-reduce seconds of ``algorithm`` (an instance, a name or a
        Schedule) on ``world_size`` ranks of this network: :func:`commrt.sim.estimate`."""
        return pricing.estimate(algorithm, world_size, nbytes, self, itemsize=itemsize)

    def price_all(
        self, algorithms: Sequence, world_size: int, nbytes: int, *, itemsize: int = 4
    ) -> list[float | None]:
        """:meth:`estimate` for each of ``algorithms``, None for those that provably cannot
        be the fastest: :func:`commrt.sim.price_all`."""
        return pricing.price_all(algorithms, world_size, nbytes, self, itemsize=itemsize)

    def describe(self) -> str:
        def link(k: Link) -> str:
            return f"α {k.alpha_s * 1e6:.3g} µs, {k.bandwidth_gbps:.4g} GB/s"

        add = f"; adds at {1e-9 / self.gamma_s_per_byte:.4g} GB/s" if self.gamma_s_per_byte else ""
        if self.overhead is not None:
            add += f"; {self.overhead.describe()}"
        if self.ranks_per_node == 1:
            return f"{self.name}: flat, {link(self.inter)}{add}"
        return (
            f"{self.name}: {self.ranks_per_node} ranks/node, intra {link(self.intra)}; "
            f"inter {link(self.inter)} per NIC, {self.nics_per_node} NIC(s)/node{add}"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Network":
        """From :meth:`to_dict` output, or a probe file
        ``{"alpha_s": .., "beta_s_per_byte": ..}`` (with ``shift_s``, ``exchange_s`` and
        ``multi_s`` if it measured the overheads)."""
        gamma = d.get("gamma_s_per_byte", 0.0)
        if "intra" in d:
            over = d.get("overhead")
            return cls(
                Link(**d["intra"]),
                Link(**d["inter"]),
                d.get("ranks_per_node", 1),
                d.get("nics_per_node", 1),
                d.get("name", "custom"),
                gamma,
                None if over is None else Overhead(**over),
            )
        if "alpha_s" in d and "beta_s_per_byte" in d:
            inter = d.get("inter_alpha_s"), d.get("inter_beta_s_per_byte")
            over = d.get("shift_s"), d.get("exchange_s"), d.get("multi_s")
            return cls.from_probe(
                d["alpha_s"],
                d["beta_s_per_byte"],
                None if None in inter else inter,
                d.get("ranks_per_node", 1),
                d.get("nics_per_node", 1),
                gamma,
                None if None in over else Overhead(*over),
            )
        raise ValueError(
            "a network file needs either intra/inter links (Network.to_dict()) "
            "or alpha_s and beta_s_per_byte (a probe result)"
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Network":
        with open(path) as f:
            return cls.from_dict(json.load(f))
