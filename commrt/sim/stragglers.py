"""Stragglers: per-rank delay distributions, arrival times, how a step aggregates them
(everyone, or the first N of N + b) and sampled training steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from commrt.sim.links import check_number, fmt_bytes
from commrt.sim.network import Network
from commrt.sim.replay import Replayer, as_schedule
from commrt.sim.run import simulate

__all__ = [
    "NoDelay",
    "Exponential",
    "LogNormal",
    "Pareto",
    "Delay",
    "arrivals",
    "synchronous_start",
    "first_n_start",
    "StragglerStats",
    "simulate_steps",
    "BackupStats",
    "simulate_backup",
]


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
        check_number("Exponential.mean_s", self.mean_s, positive=False)

    @classmethod
    def from_mean(cls, mean_s: float) -> "Exponential":
        """The exponential delay of mean ``mean_s`` (finite, non-negative; else ValueError)."""
        return cls(check_number("Exponential.mean_s", mean_s, positive=False))

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
        check_number("LogNormal.median_s", self.median_s, positive=False)
        check_number("LogNormal.sigma", self.sigma, positive=False)

    @classmethod
    def from_mean(cls, mean_s: float, sigma: float = 1.0) -> "LogNormal":
        """The log-normal delay of mean ``mean_s`` and spread ``sigma`` (mean = median·e^(σ²/2)).

        ValueError unless ``mean_s`` is finite and non-negative and ``sigma`` finite and
        positive.
        """
        mean_s = check_number("LogNormal mean_s", mean_s, positive=False)
        sigma = check_number("LogNormal.sigma", sigma, positive=True)
        return cls(mean_s / float(np.exp(sigma**2 / 2)), sigma)

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        return self.median_s * np.exp(self.sigma * rng.standard_normal(size))

    @property
    def mean_s(self) -> float:
        return self.median_s * math.exp(self.sigma**2 / 2)

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
        check_number("Pareto.scale_s", self.scale_s, positive=False)
        check_number("Pareto.shape", self.shape, positive=True)

    @classmethod
    def from_mean(cls, mean_s: float, shape: float = 2.0) -> "Pareto":
        """The Pareto delay of mean ``mean_s`` and tail ``shape`` (mean = scale/(shape−1)).

        ValueError unless ``mean_s`` is finite and non-negative and ``shape`` finite and
        above 1 (at or below 1 the mean is infinite).
        """
        mean_s = check_number("Pareto mean_s", mean_s, positive=False)
        shape = check_number("Pareto.shape", shape, positive=True)
        if shape <= 1:
            raise ValueError(f"pareto shape must be above 1 for a finite mean, got {shape:g}")
        return cls(mean_s * (shape - 1), shape)

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        return self.scale_s * rng.pareto(self.shape, size)

    @property
    def mean_s(self) -> float:
        return self.scale_s / (self.shape - 1) if self.shape > 1 else float("inf")

    def __str__(self) -> str:
        return f"pareto(scale {self.scale_s * 1e3:.3g} ms, shape {self.shape:g})"


Delay = NoDelay | Exponential | LogNormal | Pareto


def arrivals(
    world_size: int,
    compute_s: float,
    delay: Delay | None,
    samples: int,
    seed: int | np.random.Generator = 0,
) -> np.ndarray:
    """When each rank is ready for the collective: ``compute_s`` + a delay draw.

    Shape ``(samples, world_size)``; deterministic for a given ``seed``.
    """
    if world_size < 1 or samples < 1:
        raise ValueError(f"world_size and samples must be positive, got {world_size} and {samples}")
    compute_s = check_number("compute_s", compute_s, positive=False)
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
class StragglerStats:
    """Sampled synchronous training steps (see :func:`simulate_steps`)."""

    name: str
    world_size: int
    nbytes: int
    compute_s: float
    delay: Delay
    overlap: float
    collective_s: float  # the all-reduce alone, everyone on time
    step_s: np.ndarray = field(repr=False)  # one per sampled step
    wait_s: np.ndarray = field(repr=False)  # mean over ranks of (slowest arrival - own arrival)

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
        return (
            f"{self.name} p={self.world_size} {fmt_bytes(self.nbytes)} · "
            f"compute {self.compute_s * 1e3:g} ms · {self.delay}: mean {self.mean_s * 1e3:.3f} ms, p99 {self.p99_s * 1e3:.3f} ms "
            f"(ideal {self.ideal_s * 1e3:.3f} ms, ×{self.slowdown:.2f}); ranks wait "
            f"{self.wait_s.mean() * 1e3:.3f} ms on average"
        )


def simulate_steps(
    algorithm_or_schedule,
    world_size: int | None = None,
    nbytes: int = 1 << 20,
    network: Network | None = None,
    *,
    compute_s: float = 0.0,
    delay: Delay | None = None,
    overlap: float = 0.0,
    samples: int = 1000,
    seed: int = 0,
    dataflow: bool = False,
    itemsize: int = 4,
) -> StragglerStats:
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
    overlap = check_number("overlap", overlap, positive=False)
    if overlap > 1:
        raise ValueError(f"overlap must be between 0 and 1, got {overlap}")
    sched = as_schedule(algorithm_or_schedule, world_size, nbytes, network)
    base = simulate(sched, nbytes=nbytes, network=network, itemsize=itemsize)
    p = sched.world_size
    arrive = arrivals(p, compute_s, delay, samples, seed)
    part = np.asarray(sched.ranks)
    arrive_part = arrive[:, part]
    start = synchronous_start(arrive_part)
    if dataflow:
        rp = Replayer(sched, int(nbytes), network, int(itemsize))
        clock = np.zeros((p, samples))
        clock[part] = arrive_part.T
        for step in sched.steps:
            clock = rp.finish_step(clock, step)
        end = clock[part].max(axis=0)
    else:
        end = start + base.time_s
    step = end - overlap * base.time_s
    wait = (start[:, None] - arrive_part).mean(axis=1)
    return StragglerStats(
        sched.name, p, int(nbytes), compute_s, delay, overlap, base.time_s, step, wait
    )


@dataclass(frozen=True, eq=False)
class BackupStats:
    """Sampled steps with ``backups`` backup workers (see :func:`simulate_backup`)."""

    world_size: int
    backups: int  # b: the step takes the first N = p - b arrivals
    compute_s: float
    delay: Delay
    collective_s: float
    step_s: np.ndarray = field(repr=False)  # one per sampled step

    @property
    def mean_s(self) -> float:
        return float(self.step_s.mean())

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.step_s, 99))


def simulate_backup(
    world_size: int,
    collective_s: float,
    backups: Sequence[int] = (0,),
    *,
    compute_s: float = 0.0,
    delay: Delay | None = None,
    samples: int = 1000,
    seed: int = 0,
) -> list[BackupStats]:
    """Sample steps that start at the N-th of p = N + b arrivals, then take ``collective_s``.

    One :class:`BackupStats` per b in ``backups``, all from the same arrival draws
    (:func:`arrivals`), so that the b compared differ only in how many late ranks
    they drop; b = 0 is the synchronous step (:func:`synchronous_start`). The
    collective is priced once by the caller (among N ranks it costs about what it
    does among p when b is small, and equally for every b compared).
    """
    delay = NoDelay() if delay is None else delay
    arrive = arrivals(world_size, compute_s, delay, samples, seed)
    return [
        BackupStats(
            world_size,
            b,
            compute_s,
            delay,
            collective_s,
            first_n_start(arrive, world_size - b) + collective_s,
        )
        for b in backups
    ]
