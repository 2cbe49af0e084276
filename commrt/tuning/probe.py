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
``repeats`` timed runs of ``steps`` steps each (20 for the small size),
each run started after a barrier, on one binding made at the warm-up and
kept, as a caller's repeated calls run (:func:`~commrt.tuning.probe_steps.time_runs`).

Noise
-----
Runs are barrier-aligned, so run i is the same run on every rank: its
agreed time is the slowest rank's (a synchronous step goes at that pace),
and a size's step time is the **median** of those over the runs. Every
rank's runs reach every rank in one gather (:func:`commrt.runtime.rows.gather`:
an exact sum all-reduce), so every rank computes the same numbers and
ends with the same model. The median, not the fastest run: where ranks
share cores with other processes, a schedule meets their bursts as often
as the probe does, and the fastest run would describe a machine the
schedules never get.

Fit: α = the 8 B step time; β = the least-squares slope of (time − α)
against bytes over the larger sizes, less γ. 4 MiB is the default
``piece_bytes``, so β is measured on full-size pieces, the way big buckets
send them. γ, the time per byte of the executor's reduction, is timed on
its own (an add of two 32 MiB halves, no messages: out of the caches, as a
large bucket's reduction runs) and taken out of the slope, which includes
it: the step adds what it receives.

Ranks on several nodes
----------------------
When the launcher says L ranks share each node (``comm.local_size``,
1 < L < p, ranks in blocks, agreed across ranks by
:func:`commrt.tuning.topology.ranks_per_node`), each link class is measured under
the concurrency the candidate schedules put on it (:func:`_tier_schedules`):

* *intra*: around each node's own ranks, every rank at once (a torus row
  phase; the ring's steps inside a node) → α, β inside a node;
* *shared*: every rank to its counterpart on the next node at once (a
  torus column phase: all L ranks of a node behind its NICs) → α between
  nodes, and the NIC's β: L ranks' bytes cross ``nics`` NICs, so the slope
  is β_NIC · L / nics;
* *inter*: local rank 0 of each node alone to the next node's, 4 MiB: its
  speed against *shared* says how many NICs the L ranks share
  (``nics_per_node``).

:meth:`ProbeResult.network` is then a two-class network with
``ranks_per_node`` = L, and ``auto`` replays each candidate's schedule on it.

Sanity checks
-------------
A tier whose α exceeds :data:`ALPHA_BOUND_S`, or a tier inside a node that
measures slower (larger β) than the NIC between nodes, is measured again
(:data:`RETRIES` times; the runs are pooled, median over all). If it is
still inconsistent, a :class:`ProbeWarning` names the tier and the numbers
and it is priced conservatively: α as measured; both tiers at the slower
β. ``ProbeResult.warnings`` keeps the messages. (Ranks crowded onto few
cores can time loopback slower than a NIC; priced as timed, such a tier
would steer ``auto`` away from the schedules that use it.)

Per-step overheads
------------------
On CPU backends with ranks spanning nodes it also times small ring,
recursive-doubling and pipelined-torus all-reduces and fits what a step of
each kind costs a rank
(:class:`commrt.sim.Overhead`, in :mod:`commrt.tuning.probe_steps`, whose doc
says why: on ranks sharing cores a step's cost is CPU time that overlaps
the wire, so α + β·n over-prices it).
``ProbeResult.shift_s``, ``exchange_s`` and ``multi_s`` keep them;
:meth:`ProbeResult.network` prices with them. None on GPUs, on one node
and in calibrations saved without them (those price with α + β·n).

A saved calibration
-------------------
``commrt probe --save FILE`` (or :meth:`ProbeResult.save`) writes the
result as JSON; ``COMMRT_CALIBRATION=FILE``, ``probe(comm,
calibration=FILE)`` or ``Auto(calibration=FILE)`` loads it instead of
measuring, so a job can reuse a calibration taken on a quiet machine. It
is checked on load on every rank: another world size, node layout or
backend, a file that is not a probe, or ranks that read different files
are a ValueError on every rank.

Cost (one node): with the default ``repeats=5``, 6 runs (1 warm-up) of 20 steps of
8 B, 4 of 1 MiB and 4 of 4 MiB: 168 messages and 60 MiB sent per rank, 15
barriers, and one small all-reduce; on CPU across nodes, 6 runs of about
40 steps of each overhead's all-reduce at 32 KiB. Once per communicator: the result is
cached in ``comm.slots.probe``.

Example::

    >>> from commrt.tuning.probe import probe                      # doctest: +SKIP
    >>> r = probe(comm)          # collective: every rank calls it    # doctest: +SKIP
    >>> r.alpha_s, r.beta_s_per_byte, r.network()                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
import zlib
from dataclasses import asdict, dataclass

import numpy as np
import torch

from commrt import settings
from commrt.schedule import Collective, Op, OpKind, Schedule, Step, Steps
from commrt.sim import Network, Overhead
from commrt.tuning.probe_checks import ALPHA_BOUND_S, RETRIES, ProbeWarning, conservative, problems
from commrt.tuning.probe_steps import agreed, measure_overheads, time_runs

__all__ = ["ProbeResult", "probe", "SIZES", "ProbeWarning", "ALPHA_BOUND_S"]
#: probed message sizes in bytes; the first one measures α
SIZES = (8, 1 << 20, 4 << 20)
#: bytes of the add that times γ, at least: past a last-level cache (32 MiB here)
GAMMA_BYTES = 32 << 20
_MIN_BETA = 1e-13  # 10 TB/s: a floor so a noisy fit never gives zero or negative β


@dataclass(frozen=True)
class ProbeResult:
    """Agreed α (s/message) and β (s/byte) of this communicator's transport.

    One link class (``ranks_per_node == 1``): ``alpha_s``/``beta_s_per_byte``
    describe every link. Ranks spanning nodes: they describe links inside
    a node, ``inter_alpha_s``/``inter_beta_s_per_byte`` one NIC between
    nodes, shared by ``ranks_per_node`` ranks over ``nics_per_node`` NICs.
    ``warnings``: the sanity checks that still failed after a second
    measurement, and how each was priced (module doc).
    """

    alpha_s: float
    beta_s_per_byte: float
    sizes: tuple[int, ...]
    step_s: tuple[float, ...]  # agreed step time per size (inside a node when two tiers)
    per_rank: tuple[tuple[float, float], ...]  # every rank's own (α, β) from its own medians
    backend: str
    world_size: int
    seconds: float  # wall time the probe took on this rank
    ranks_per_node: int = 1
    inter_alpha_s: float | None = None
    inter_beta_s_per_byte: float | None = None
    inter_step_s: tuple[float, ...] = ()  # every rank of a node off-node at once, per size
    alone_step_s: float | None = None  # one rank per node off-node, largest size
    nics_per_node: int = 1
    gamma_s_per_byte: float = 0.0  # agreed reduction time per byte
    repeats: int = 0  # timed runs per size (more where a tier was measured again)
    warnings: tuple[str, ...] = ()
    # per-step overheads (commrt.tuning.probe_steps; None on GPUs and in calibrations saved before)
    shift_s: float | None = None
    exchange_s: float | None = None
    multi_s: float | None = None

    @property
    def two_tier(self) -> bool:
        return self.inter_alpha_s is not None

    @property
    def overhead(self) -> Overhead | None:
        """The per-step overheads it measured (CPU backends across nodes), or None."""
        return self.network().overhead

    def network(self) -> Network:
        """The :class:`~commrt.sim.Network` for the simulator and ``auto`` (two classes if
        probed; with its per-step overheads if measured): read as a saved file is read."""
        return Network.from_dict(self.to_dict())

    @property
    def bandwidth_gbps(self) -> float:
        return 1.0 / self.beta_s_per_byte / 1e9

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | os.PathLike) -> str:
        """Write JSON that :meth:`load`, ``COMMRT_CALIBRATION``, ``commrt simulate --network
        FILE`` and :meth:`Network.load` read."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ProbeResult":
        """A result :meth:`save` wrote (ValueError naming the file if it is not one)."""
        try:
            with open(path) as f:
                d = json.load(f)
            names = {f.name for f in dataclasses.fields(cls)}
            d = {k: tuple(map(tuple, v)) if k == "per_rank" else v for k, v in d.items()}
            d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
            return cls(**d)
        except (OSError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{os.fspath(path)} is not a saved commrt probe: {e}") from e

    def check_matches(self, world_size: int, ranks_per_node: int | None, backend: str) -> None:
        """ValueError unless this calibration was taken on the same world size, node layout
        and backend."""
        want = (world_size, ranks_per_node or 1, backend)
        have = (self.world_size, self.ranks_per_node, self.backend)
        if want != have:
            raise ValueError(
                f"saved calibration was taken on {have[0]} ranks, {have[1]} per node, over "
                f"{have[2]}; this job has {want[0]} ranks, {want[1]} per node, over {want[2]}: "
                "probe this job again (commrt probe --save FILE) or unset "
                f"{settings.CALIBRATION.name}"
            )

    def __str__(self) -> str:
        head = f"probe ({self.backend}, {self.world_size} ranks, {self.seconds * 1e3:.0f} ms): "
        link = f"α = {self.alpha_s * 1e6:.1f} µs, β = 1/({self.bandwidth_gbps:.2f} GB/s)"
        if self.gamma_s_per_byte:
            link += f", adds at {1e-9 / self.gamma_s_per_byte:.2f} GB/s"
        steps = "" if self.overhead is None else f"; {self.overhead.describe()}"
        if not self.two_tier:
            return head + link + steps
        inter_gbps = 1e-9 / self.inter_beta_s_per_byte
        return (
            head + f"{self.ranks_per_node} ranks/node; inside a node {link}; between nodes "
            f"α = {self.inter_alpha_s * 1e6:.1f} µs, β = 1/({inter_gbps:.3f} GB/s) per NIC, "
            f"{self.nics_per_node} NIC(s)/node{steps}"
        )


def _shift_schedule(world_size: int, steps: int, nxt=None, ranks=None) -> Schedule:
    """``steps`` ring-shift steps: send chunk 0 to ``nxt[r]``, add its sender's into chunk 1.

    Like a reduce-scatter step of the ring (receive into scratch, then
    add). Not an all-reduce: the executor runs it without asking.
    ``nxt`` (default r+1) must be a permutation of ``ranks`` (default all).
    """
    p = world_size
    ranks = tuple(range(p)) if ranks is None else tuple(ranks)
    nxt = {r: (r + 1) % p for r in ranks} if nxt is None else nxt
    prv = {nxt[r]: r for r in ranks}
    ops = []
    for r in ranks:
        ops += [Op(OpKind.SEND, r, nxt[r], 0, 1), Op(OpKind.RECV_REDUCE, r, prv[r], 1, 2)]
    step = Step.of(ops, "probe")
    return Schedule("probe", Collective.ALL_REDUCE, p, ranks, 2, Steps(steps, lambda i: step))


def _tier_schedules(p: int, per_node: int) -> dict:
    """The ring shifts that measure each link class when ``per_node`` ranks share a node.

    ``intra``: a shift around each node's own ranks (all nodes at once, as in
    a torus row phase). ``shared``: every rank shifts to its counterpart on
    the next node (all ranks of a node off-node at once, as in a torus
    column phase). ``inter``: local rank 0 of each node alone to the next
    node's; its speed against ``shared`` says how many NICs the ranks share.
    """
    L = per_node
    intra = {r: r - r % L + (r % L + 1) % L for r in range(p)}
    shared = {r: (r + L) % p for r in range(p)}
    lead = tuple(range(0, p, L))
    return {
        "intra": (intra, None),
        "inter": ({r: shared[r] for r in lead}, lead),
        "shared": (shared, None),
    }


@dataclass(frozen=True)
class _Tier:
    """One measurement: the shift ``tiers[key]`` (None: the plain ring shift) at ``sizes``."""

    key: str | None
    sizes: tuple[int, ...]
    big_steps: int  # steps per run above 4 KiB (20 at or below)


def _plan(sizes: tuple[int, ...], per_node: int | None) -> dict[str, _Tier]:
    if per_node is None:
        return {"flat": _Tier(None, sizes, 4)}
    # Fewer steps between nodes: there the messages are the slow ones.
    return {
        "intra": _Tier("intra", sizes, 4),
        "shared": _Tier("shared", sizes, 2),
        "inter": _Tier("inter", sizes[-1:], 2),
    }


def _time_reduce(comm, nbytes: int, repeats: int) -> float:
    """Seconds per byte of the executor's reduction: add at least :data:`GAMMA_BYTES` of
    float32 into as many, in memory the add must read and write (ones, not calloc's zero
    pages). Out of the caches, as a large bucket's reduction runs: an add of 4 MiB halves
    runs from a last-level cache about ten times faster, and priced recursive doubling at
    16 MiB on 2 ranks (it adds the whole buffer, the ring half of it) level with the ring,
    which runs 1.5× faster."""
    half = max(1, max(nbytes, GAMMA_BYTES) // 4)
    buf = torch.ones(2 * half, dtype=torch.float32, device=comm.device)
    dst, src = buf[half:], buf[:half]
    sync = torch.cuda.synchronize if buf.device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        sync()
        t0 = time.perf_counter()
        comm.executor.reduce(dst, src)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) / (half * buf.element_size())


def _fit(sizes, times, gamma: float = 0.0) -> tuple[float, float]:
    """(α, β): the first size's time, and the slope over the others less ``gamma`` (each
    probe step adds what it receives, so its slope includes the reduction)."""
    alpha = max(float(times[0]), 0.0)
    s = np.asarray(sizes[1:], dtype=np.float64)
    t = np.asarray(times[1:], dtype=np.float64) - alpha
    beta = float((s * t).sum() / (s * s).sum()) - gamma if len(s) else _MIN_BETA
    return alpha, max(beta, _MIN_BETA)


def _measure(comm, tier: _Tier, per_node, repeats: int) -> list[float]:
    """This rank's per-run step times, size after size (about 0 where it sits the shift out:
    the agreed time is the largest)."""
    shifts = _tier_schedules(comm.world_size, per_node) if tier.key else {}
    nxt, ranks = shifts.get(tier.key, (None, None))
    out = []
    for nb in tier.sizes:
        # two chunks of nb bytes: one goes out, the other takes the incoming sum
        buf = torch.zeros(2 * max(1, nb // 4), dtype=torch.float32, device=comm.device)
        sched = _shift_schedule(comm.world_size, 20 if nb <= 4096 else tier.big_steps, nxt, ranks)
        out += time_runs(comm, sched, buf, repeats)
    return out


def _nics(per_node: int, alone_s: float, shared_s: float, alpha_s: float) -> int:
    """NICs per node from how much slower a node's ranks go off-node together than one alone
    (same message size): L ranks on one NIC take L times as long, on L NICs as long."""
    slowdown = max(shared_s - alpha_s, 1e-12) / max(alone_s - alpha_s, 1e-12)
    estimate = per_node / max(slowdown, 1e-9)
    # nearest on a log scale: 1.3 NICs' worth of slowdown is 1 NIC, not a tie-break of round()
    return min(range(1, per_node + 1), key=lambda k: abs(math.log(k / estimate)))


def _gather_runs(comm, plan: dict, names, per_node, repeats: int, gamma: float):
    """Every rank's per-run step times of the tiers ``names``, as ``{name: array (ranks,
    sizes, runs)}`` on every rank, and the largest γ (one gather)."""
    mine = [t for n in names for t in _measure(comm, plan[n], per_node, repeats)]
    from commrt.runtime.rows import gather

    table = np.asarray(gather(comm, [*mine, gamma]), dtype=np.float64)
    out, col = {}, 0
    for n in names:
        k = len(plan[n].sizes)
        out[n] = table[:, col : col + k * repeats].reshape(len(table), k, repeats)
        col += k * repeats
    return out, float(table[:, -1].max())


def _model(runs: dict, sizes, per_node, gamma: float) -> dict:
    """The ProbeResult fields that the measurements ``runs`` give."""
    first = runs["flat" if per_node is None else "intra"]
    own = np.median(first, axis=-1)  # each rank's own medians, for per_rank
    steps = agreed(first)
    alpha, beta = _fit(sizes, steps, gamma)
    m = dict(
        alpha_s=alpha,
        beta_s_per_byte=beta,
        step_s=tuple(steps),
        per_rank=tuple(_fit(sizes, row, gamma) for row in own),
        gamma_s_per_byte=gamma,
        repeats=first.shape[-1],
    )
    if per_node is None:
        return m
    shared, alone = agreed(runs["shared"]), agreed(runs["inter"])[-1]
    inter_alpha, slope = _fit(sizes, shared, gamma)
    nics = _nics(per_node, alone, shared[-1], inter_alpha)
    # L ranks' bytes cross nics NICs at once: slope = β_NIC · L / nics (module doc)
    inter_beta = max(slope * nics / per_node, _MIN_BETA)
    return m | dict(
        ranks_per_node=per_node,
        inter_alpha_s=inter_alpha,
        inter_beta_s_per_byte=inter_beta,
        inter_step_s=tuple(shared),
        alone_step_s=alone,
        nics_per_node=nics,
    )


def _measured(comm, sizes, repeats: int, per_node) -> dict:
    """Measure, check, measure failing tiers again (runs pooled), price what still fails
    conservatively. Every rank sees the same gathered runs, so all decide alike."""
    # the reduction's own pace (no messages), taken out of the fitted slopes
    gamma = _time_reduce(comm, sizes[-1], repeats)
    plan = _plan(sizes, per_node)
    runs, gamma = _gather_runs(comm, plan, list(plan), per_node, repeats, gamma)
    m = _model(runs, sizes, per_node, gamma)
    wrong = problems(m)
    for _ in range(RETRIES):
        if not wrong:
            break
        again = sorted({t for tiers, _ in wrong for t in tiers})
        more, _ = _gather_runs(comm, plan, again, per_node, repeats, gamma)
        runs = {
            k: np.concatenate([v, more[k]], axis=-1) if k in more else v for k, v in runs.items()
        }
        m = _model(runs, sizes, per_node, gamma)
        wrong = problems(m)
    m = conservative(m, wrong) if wrong else m
    if comm.device.type == "cpu" and per_node:  # across nodes: time steps (probe_steps doc)
        over = measure_overheads(comm, Network.from_dict(m), repeats)
        m |= asdict(over)  # shift_s, exchange_s, multi_s: ProbeResult's fields
    return m


def _loaded(comm, path: str, per_node) -> ProbeResult:
    """The calibration at ``path``, checked against this job on every rank (collective: a
    rank that cannot use it, or ranks that read different files, fail every rank)."""
    from commrt.runtime.rows import gather

    err, crc = None, 0
    try:
        res = ProbeResult.load(path)
        res.check_matches(comm.world_size, per_node, comm.backend.value)
        with open(path, "rb") as f:
            crc = zlib.crc32(f.read())
    except ValueError as e:
        err = str(e)
    rows = gather(comm, [1.0 if err else 0.0, float(crc)])
    if err:
        raise ValueError(f"rank {comm.rank}: {err}")
    bad = [r for r, row in enumerate(rows) if row[0]]
    if bad:
        raise ValueError(f"rank(s) {bad} could not use the calibration {path}")
    if len({row[1] for row in rows}) > 1:
        raise ValueError(f"ranks read different calibration files at {path}")
    return res


def probe(
    comm, *, sizes=SIZES, repeats: int = 5, force: bool = False, calibration=None
) -> ProbeResult:
    """Measure α and β on ``comm``'s transport and agree on them (collective; cached).

    Every rank must call it, in the same order relative to other
    collectives (``algorithm="auto"`` does so inside ``select``). The
    result is cached in ``comm.slots.probe``; ``force`` probes
    again. When the launcher says the ranks span nodes (``comm.local_size``
    L with 1 < L < p, ranks in blocks of L), both link classes are
    measured (module doc). ``calibration`` (default: the file named by
    ``COMMRT_CALIBRATION``): load a saved result instead of measuring,
    ValueError on every rank if it was taken on another world size, node
    layout or backend. Sanity checks that fail twice are a
    :class:`ProbeWarning` and are listed in ``ProbeResult.warnings``.
    """
    cached = comm.slots.probe
    if cached is not None and not force:
        return cached
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or sorted(sizes) != list(sizes) or sizes[0] < 4:
        raise ValueError(
            f"probe sizes must be increasing, at least two, from 4 bytes up; got {sizes}"
        )
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    path = calibration if calibration is not None else settings.CALIBRATION.text() or None
    t_start = time.perf_counter()
    p = comm.world_size
    from commrt.tuning.topology import ranks_per_node

    comm.admit_collective()
    with comm.lock:
        per_node = ranks_per_node(comm) if p > 1 else None
        if path is not None and not force:
            res = _loaded(comm, os.fspath(path), per_node)
        elif p == 1:
            res = ProbeResult(
                0.0,
                _MIN_BETA,
                sizes,
                (0.0,) * len(sizes),
                ((0.0, _MIN_BETA),),
                comm.backend.value,
                1,
                0.0,
            )
        else:
            m = _measured(comm, sizes, repeats, per_node)
            elapsed = time.perf_counter() - t_start
            res = ProbeResult(
                sizes=sizes, backend=comm.backend.value, world_size=p, seconds=elapsed, **m
            )
    comm.slots.probe = res
    return res
