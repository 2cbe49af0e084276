"""A quick α-β probe of the actual transport, for ``algorithm="auto"``.

What it sends
-------------
Every rank runs, through the communicator's own executor and transport, a
*ring shift*: a schedule whose every step sends one message to rank
``r+1`` and adds the one from rank ``r−1`` into its buffer (p = 2: to and
from the one peer). That is one reduce-scatter step of a ring all-reduce,
with the executor's per-step overhead and the reduction included, so
α and β describe the steps ``commrt.all_reduce`` really runs. For each size
in :data:`SIZES` (8 B, 1 MiB, 4 MiB) it runs a warm-up, then
``repeats`` timed runs of ``steps`` steps each (more steps for the small
size), each run started after a barrier; the time per step is that of the
fastest run (other processes on the machine only ever add time, and a
probe this short is easily hit by a burst of them: on the shared 2-core
test machine the median of 3 runs once read 850 µs for an 8 B step that
takes 50 µs).

Fit: α = the 8 B step time; β = the least-squares slope of (time − α)
against bytes over the larger sizes. 4 MiB is the default ``piece_bytes``,
so β is measured on full-size pieces, the way big buckets send them.

Agreement: ranks must choose the same algorithm, so every rank's (α, β)
goes to everyone in one ring all-reduce of a small float64 buffer of p
rows (α, β, step times), each rank filling its own row and zeros elsewhere
(so the sum is exact and bit-identical everywhere), and all use the **largest** α and the largest β
(synchronous steps go at the pace of the slowest link).

Cost: with the default ``repeats=5``, 6 runs (1 warm-up) of 20 steps of
8 B, 4 of 1 MiB and 4 of 4 MiB: 168 messages and 60 MiB sent per rank, 15
barriers, and one small all-reduce: about 0.1 s with 2 ranks and 0.3 s
with 4 ranks on this 2-core machine (oversubscribed, so every step
waits for a core), once per communicator: the result is cached in
``comm.cache["commrt.probe"]``.

Example::

    >>> from commrt.probe import probe                      # doctest: +SKIP
    >>> r = probe(comm)          # collective: every rank calls it
    >>> r.alpha_s, r.beta_s_per_byte, r.network()
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from commrt.schedule import Collective, Op, OpKind, Schedule, Step, Steps
from commrt.sim import Network

__all__ = ["ProbeResult", "probe", "CACHE_KEY", "SIZES"]

CACHE_KEY = "commrt.probe"
#: probed message sizes in bytes; the first one measures α
SIZES = (8, 1 << 20, 4 << 20)
_MIN_BETA = 1e-13     # 10 TB/s: a floor so a noisy fit never gives zero or negative β


@dataclass(frozen=True)
class ProbeResult:
    """Agreed α (s/message) and β (s/byte) of this communicator's transport."""

    alpha_s: float
    beta_s_per_byte: float
    sizes: tuple[int, ...]
    step_s: tuple[float, ...]              # agreed (max over ranks) step time per size
    per_rank: tuple[tuple[float, float], ...]   # every rank's own (α, β)
    backend: str
    world_size: int
    seconds: float                         # wall time the probe took on this rank

    def network(self) -> Network:
        """The flat :class:`~commrt.sim.Network` for the simulator and ``auto``."""
        return Network.from_probe(self.alpha_s, self.beta_s_per_byte)

    @property
    def bandwidth_gbps(self) -> float:
        return 1.0 / self.beta_s_per_byte / 1e9

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | os.PathLike) -> str:
        """Write JSON that ``commrt simulate --network FILE`` and :meth:`Network.load` read."""
        path = os.fspath(path)
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        return path

    def __str__(self) -> str:
        return (f"probe ({self.backend}, {self.world_size} ranks, {self.seconds * 1e3:.0f} ms): "
                f"α = {self.alpha_s * 1e6:.1f} µs, β = 1/({self.bandwidth_gbps:.2f} GB/s)")


def _shift_schedule(world_size: int, steps: int) -> Schedule:
    """``steps`` ring-shift steps: send chunk 0 to r+1, add r−1's into chunk 1.

    Like a reduce-scatter step of the ring (receive into scratch, then
    add). Not an all-reduce: the executor runs it without asking.
    """
    p = world_size
    ops = []
    for r in range(p):
        ops += [Op(OpKind.SEND, r, (r + 1) % p, 0, 1), Op(OpKind.RECV_REDUCE, r, (r - 1) % p, 1, 2)]
    step = Step.of(ops, "probe")
    return Schedule("probe", Collective.ALL_REDUCE, p, tuple(range(p)), 2, Steps(steps, lambda i: step))


def _time_steps(comm, sched: Schedule, buf: torch.Tensor, repeats: int) -> float:
    run = comm.executor.run
    kw = dict(timeout=comm.timeout, piece_bytes=comm.piece_bytes)
    run(sched, buf, comm.transport, **kw)        # warm-up: plan, scratch, connections
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        run(sched, buf, comm.transport, **kw)
        times.append((time.perf_counter() - t0) / sched.num_steps)
    return min(times)


def _fit(sizes, times) -> tuple[float, float]:
    alpha = max(float(times[0]), 0.0)
    s = np.asarray(sizes[1:], dtype=np.float64)
    t = np.asarray(times[1:], dtype=np.float64) - alpha
    beta = float((s * t).sum() / (s * s).sum()) if len(s) else _MIN_BETA
    return alpha, max(beta, _MIN_BETA)


def probe(comm, *, sizes=SIZES, repeats: int = 5, force: bool = False) -> ProbeResult:
    """Measure α and β on ``comm``'s transport and agree on them (collective; cached).

    Every rank must call it, in the same order relative to other
    collectives (``algorithm="auto"`` does so inside ``select``). The
    result is cached in ``comm.cache["commrt.probe"]``; ``force`` probes
    again.
    """
    cached = comm.cache.get(CACHE_KEY)
    if cached is not None and not force:
        return cached
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or sorted(sizes) != list(sizes) or sizes[0] < 4:
        raise ValueError(f"probe sizes must be increasing, at least two, from 4 bytes up; got {sizes}")
    t_start = time.perf_counter()
    p = comm.world_size
    with comm.lock:
        if p == 1:
            res = ProbeResult(0.0, _MIN_BETA, sizes, tuple(0.0 for _ in sizes), ((0.0, _MIN_BETA),),
                              comm.backend.value, 1, 0.0)
            comm.cache[CACHE_KEY] = res
            return res
        mine = []
        for nb in sizes:
            numel = 2 * max(1, nb // 4)          # two chunks of nb bytes
            buf = torch.zeros(numel, dtype=torch.float32, device=comm.device)
            steps = 20 if nb <= 4096 else 4
            mine.append(_time_steps(comm, _shift_schedule(p, steps), buf, repeats))
        alpha, beta = _fit(sizes, mine)
        # Agree: everyone's numbers, exactly, on every rank.
        from commrt.collectives import gather_rows
        rows = gather_rows(comm, [alpha, beta, *mine])
    res = ProbeResult(max(r[0] for r in rows), max(r[1] for r in rows), sizes,
                      tuple(max(r[2 + i] for r in rows) for i in range(len(sizes))),
                      tuple((r[0], r[1]) for r in rows), comm.backend.value, p,
                      time.perf_counter() - t_start)
    comm.cache[CACHE_KEY] = res
    return res
