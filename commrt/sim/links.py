"""Link classes and per-step costs, the pieces a :class:`~commrt.sim.network.Network` is
made of: :class:`Link` (α and β of one class), :class:`Overhead` (what a step costs ranks
that share cores), and the number checks and formats the whole simulator shares.

They sit below the rest of :mod:`commrt.sim`: the replay and the pricing read them, and
the network, which prices algorithms on itself, is built from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["GB", "Link", "Overhead", "check_number", "fmt_bytes"]

GB = 1e9


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 41943 -> '40.96 KiB': the one format of every size commrt
    prints (binary units, as its size flags and ``bucket_mb`` count; four significant
    digits at most)."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.4g} {unit}"
    return f"{int(n)} B"


def check_number(name: str, value, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(
            f"{name} must be {'positive' if positive else 'non-negative'} and finite, got {value!r}"
        )
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
        object.__setattr__(self, "alpha_s", check_number("alpha_s", self.alpha_s, positive=False))
        object.__setattr__(
            self,
            "beta_s_per_byte",
            check_number("beta_s_per_byte", self.beta_s_per_byte, positive=True),
        )

    @classmethod
    def from_bandwidth(cls, alpha_us: float, gbytes_per_s: float) -> "Link":
        """A link from a latency in µs and a bandwidth in GB/s (10^9 bytes/s)."""
        bw = check_number("gbytes_per_s", gbytes_per_s, positive=True)
        return cls(check_number("alpha_us", alpha_us, positive=False) * 1e-6, 1.0 / (bw * GB))

    @property
    def bandwidth_gbps(self) -> float:
        """Bandwidth in GB/s (10^9 bytes/s)."""
        return round(1.0 / self.beta_s_per_byte / GB, 9)

    def time(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte


@dataclass(frozen=True)
class Overhead:
    """What a step costs a rank when the wire is not what limits it (LogP's *o*).

    Ranks that share a few cores (more ranks than cores, gloo or MPI over
    TCP) pay for a step in CPU time: waking up, posting, copying, adding. That
    cost overlaps the wire (another rank runs while one waits), so with an
    ``Overhead`` a message takes ``max(β·load, cost)`` instead of
    ``α + β·load``, where ``cost`` is the larger of its two ranks'
    overheads in that step:

    * ``shift_s``: a step whose messages go to another rank than the one
      they come from (a ring step);
    * ``exchange_s``: a step that swaps with the same peer(s) (recursive
      doubling, halving-doubling, a ring of 2); kept apart because on
      shared cores the two differ;
    * ``multi_s``: a step in which the rank sends or takes in more than one
      message (a pipelined torus's overlapped segments). One cost for the
      step, not a cost per message: it hardly grows with the number of
      messages.

    :mod:`commrt.tuning.probe` measures them on CPU backends, across nodes, by
    timing small all-reduces of each kind (:mod:`commrt.tuning.probe_steps`).

    Example::

        >>> Overhead(1e-3, 1.6e-3, 2.8e-3).describe()
        'steps: shift 1 ms, exchange 1.6 ms, several messages 2.8 ms'
    """

    shift_s: float
    exchange_s: float
    multi_s: float

    def __post_init__(self):
        for f in ("shift_s", "exchange_s", "multi_s"):
            object.__setattr__(self, f, check_number(f, getattr(self, f), positive=False))

    def rank_costs(self, src: np.ndarray, dst: np.ndarray, p: int) -> np.ndarray:
        """Per rank: its overhead in a step whose messages go ``src[i] -> dst[i]``."""
        sends, recvs = np.bincount(src, minlength=p), np.bincount(dst, minlength=p)
        # a message whose reverse is in the step is half of an exchange
        back = np.isin(dst * p + src, src * p + dst)
        one_way = np.bincount(src, (~back).astype(np.float64), p) + np.bincount(
            dst, (~back).astype(np.float64), p
        )
        busy = np.maximum(sends, recvs)
        cost = np.where(one_way > 0, self.shift_s, self.exchange_s)
        cost = np.where(busy > 1, self.multi_s, cost)
        return np.where(busy > 0, cost, 0.0)

    def describe(self) -> str:
        return (
            f"steps: shift {self.shift_s * 1e3:.3g} ms, exchange {self.exchange_s * 1e3:.3g} ms, "
            f"several messages {self.multi_s * 1e3:.3g} ms"
        )
