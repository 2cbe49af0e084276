"""Replay of a real :class:`~commrt.Schedule` under a :class:`~commrt.sim.network.Network`:
:func:`replay`, its result (:class:`SimResult`, :class:`StepCost`) and the per-step
message and clock arithmetic (:class:`Replayer`); the model is in :mod:`commrt.sim`.

It reads the network it is handed and never imports :mod:`commrt.sim.network`, which
prices algorithms with it (through :mod:`commrt.sim.pricing`); the public
:func:`commrt.sim.simulate`, which supplies a default network, is
:mod:`commrt.sim.run`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from commrt.algorithms.registry import resolve
from commrt.schedule import RECV_REDUCE, SEND, Collective, Schedule, Step
from commrt.sim.links import GB, fmt_bytes

__all__ = ["StepCost", "SimResult", "Replayer", "as_schedule", "replay"]


@dataclass(frozen=True)
class StepCost:
    """One row of :attr:`SimResult.steps`."""

    index: int
    phase: str
    time_s: float  # how much this step moved the finish of the slowest rank
    end_s: float  # when the last rank left this step
    slowest_message_s: float
    bytes: int  # sum over its messages
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
    network: object  # the commrt.sim.Network it was replayed on
    time_s: float
    collective: Collective = field(repr=False)
    start_s: float = field(repr=False)
    rank_finish_s: np.ndarray = field(repr=False)  # absolute, per rank (NaN: not a participant)
    step_phase: tuple[str, ...] = field(repr=False)
    step_end_s: np.ndarray = field(repr=False)  # absolute: last rank out of each step
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
        return [
            StepCost(
                i,
                self.step_phase[i],
                float(t[i]),
                float(self.step_end_s[i]),
                float(self.step_slowest_s[i]),
                int(self.step_bytes[i]),
                int(self.step_messages[i]),
            )
            for i in range(self.num_steps)
        ]

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
        lines = [
            f"{self.name} · p={self.world_size} · {fmt_bytes(self.nbytes)} · {self.network.name}: "
            f"{self.time_s * 1e6:.1f} µs (busbw {self.busbw_gbps:.1f} GB/s)"
        ]
        for ph, (n, t) in self.by_phase().items():
            lines.append(f"  {ph or '(no phase)':<16} {n:6d} steps {t * 1e6:12.1f} µs")
        lines.append(
            f"  {'step':>6} {'phase':<16} {'+time(µs)':>11} {'slowest msg':>12} "
            f"{'bytes':>12} {'msgs':>7}"
        )
        for s in self.steps[:max_steps]:
            lines.append(
                f"  {s.index:6d} {s.phase:<16} {s.time_s * 1e6:11.2f} "
                f"{s.slowest_message_s * 1e6:12.2f} {s.bytes:12d} {s.messages:7d}"
            )
        if self.num_steps > max_steps:
            lines.append(f"  … {self.num_steps - max_steps} more steps")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def as_schedule(algorithm_or_schedule, world_size: int | None, nbytes: int, network) -> Schedule:
    """A Schedule, an Algorithm instance or a name -> the schedule to replay on ``network``."""
    if isinstance(algorithm_or_schedule, Schedule):
        s = algorithm_or_schedule
        if world_size is not None and world_size != s.world_size:
            raise ValueError(
                f"the schedule {s.name!r} is for world_size {s.world_size}, not {world_size}"
            )
        return s
    alg = resolve(algorithm_or_schedule)
    if world_size is None:
        raise ValueError(
            "simulate() needs world_size when given an algorithm rather than a Schedule"
        )
    # an algorithm that chooses by the network ("auto") chooses for the simulated one
    return alg.on_network(network).select(world_size, nbytes)


def _bounds(numel: int, num_chunks: int) -> np.ndarray:
    """chunk_bounds(numel, num_chunks) as an int64 array, vectorised."""
    base, extra = divmod(numel, num_chunks)
    c = np.arange(num_chunks + 1, dtype=np.int64)
    return c * base + np.minimum(c, extra)


class Replayer:
    """Message times and the per-rank clock update of one step (see module doc)."""

    def __init__(self, schedule: Schedule, nbytes: int, network, itemsize: int):
        if itemsize < 1:
            raise ValueError(f"itemsize must be a positive number of bytes, got {itemsize}")
        if nbytes < 0 or nbytes % itemsize:
            raise ValueError(
                f"nbytes must be a non-negative multiple of itemsize={itemsize}, got {nbytes}"
            )
        self.bounds = _bounds(nbytes // itemsize, schedule.num_chunks) * itemsize  # byte offsets
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
        send = np.flatnonzero(step.kind == SEND)  # int indices: far cheaper than boolean masks
        src, dst = step.rank.take(send), step.peer.take(send)
        b = (self.bounds.take(step.hi.take(send)) - self.bounds.take(step.lo.take(send))).astype(
            np.float64
        )
        if not (b > 0).all():
            keep = np.flatnonzero(b > 0)
            src, dst, b = src.take(keep), dst.take(keep), b.take(keep)
        if not len(b):
            return src, dst, b, b
        p = self.p
        if self.single is not None:
            link = self.single
            load = np.maximum(
                b, np.maximum(np.bincount(src, b, p).take(src), np.bincount(dst, b, p).take(dst))
            )
            return src, dst, b, self.priced(src, dst, link.alpha_s, link.beta_s_per_byte * load)
        # Two classes: per-rank ports are keyed (rank, class), so intra and inter traffic
        # never share.
        ns, nd = self.node.take(src), self.node.take(dst)
        cls = (ns != nd).astype(np.int64)  # 0 intra-node, 1 inter-node
        ks, kd = src * 2 + cls, dst * 2 + cls
        load = np.maximum(
            b, np.maximum(np.bincount(ks, b, 2 * p).take(ks), np.bincount(kd, b, 2 * p).take(kd))
        )
        if self.shared_nics and cls.any():
            bi = b * cls
            nic = (
                np.maximum(
                    np.bincount(ns, bi, self.nnodes).take(ns),
                    np.bincount(nd, bi, self.nnodes).take(nd),
                )
                / self.net.nics_per_node
            )
            load = np.where(cls == 1, np.maximum(load, nic), load)
        return src, dst, b, self.priced(src, dst, self.alpha.take(cls), self.beta.take(cls) * load)

    def priced(self, src: np.ndarray, dst: np.ndarray, alpha, wire: np.ndarray) -> np.ndarray:
        """Seconds per message: ``α + wire``, or with the network's :class:`Overhead` the
        wire or the larger of its two ranks' step overheads, whichever is longer."""
        over = self.net.overhead
        if over is None:
            return alpha + wire
        cost = over.rank_costs(src, dst, self.p)
        return np.maximum(wire, np.maximum(cost.take(src), cost.take(dst)))

    @staticmethod
    def advance(
        clock: np.ndarray, src: np.ndarray, dst: np.ndarray, t: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """New clocks (shape (p,) or (p, samples)) after a step's messages, and the last
        message's end."""
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
            if len(np.unique(idx)) == len(idx):  # one message per rank: plain fancy indexing
                new[idx] = np.maximum(new[idx], fin)
            else:
                np.maximum.at(new, idx, fin)
        return new, float(fin.max())


def replay(
    algorithm_or_schedule,
    world_size: int | None,
    nbytes: int,
    network,
    *,
    itemsize: int = 4,
    start_s: Sequence[float] | np.ndarray | None = None,
) -> SimResult:
    """Replay a schedule under ``network`` (a :class:`~commrt.sim.Network`); return its
    time and per-step costs. :func:`commrt.sim.simulate` is this with the network checked
    and defaulted; see it for the arguments."""
    sched = as_schedule(algorithm_or_schedule, world_size, nbytes, network)
    rp = Replayer(sched, int(nbytes), network, int(itemsize))
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
    return SimResult(
        sched.name,
        p,
        int(nbytes),
        network,
        float(finish[part].max() - t0),
        sched.collective,
        t0,
        finish,
        tuple(phase),
        end,
        slowest,
        nb,
        nm,
    )
