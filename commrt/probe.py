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
against bytes over the larger sizes, less γ. 4 MiB is the default ``piece_bytes``,
so β is measured on full-size pieces, the way big buckets send them.
γ, the time per byte of the executor's reduction, is timed on its own (an
add of the 4 MiB buffer's two halves, no messages) and taken out of the
slope, which includes it: the step adds what it receives. Algorithms that
add more than they send (recursive doubling) then price honestly.

Ranks on several nodes
----------------------
When the launcher says L ranks share each node (``comm.local_size``,
1 < L < p, ranks in blocks, agreed across ranks by
:meth:`~commrt.comm.Communicator.ranks_per_node`),
the probe measures the two link classes of :class:`~commrt.sim.Network`
with three shifts (:func:`_tier_schedules`):

* *intra*: around each node's own ranks, all nodes at once (8 B, 1 MiB,
  4 MiB) → α, β inside a node;
* *inter α*: every rank to its counterpart on the next node, 8 B: the
  per-message cost with every rank busy, as in a collective step;
* *inter β*: local rank 0 of each node alone to the next node's (1 MiB,
  4 MiB, 2 steps a run: these are the slow messages) → one NIC's β;
* *shared*: every rank to the next node at 4 MiB: L ranks behind one NIC
  take L times as long as one alone, behind L NICs as long, which gives
  ``nics_per_node``.

:meth:`ProbeResult.network` is then a two-class network with
``ranks_per_node`` = L, and ``auto`` replays each candidate's schedule on
it. On 4 namespace hosts × 2 ranks with 1 Gbit/s links (tests/netns.py) it
finds about 0.12 GB/s per NIC, one NIC per node, in 2–3 s.

Agreement: ranks must choose the same algorithm, so every rank's (α, β)
goes to everyone in one ring all-reduce of a small float64 buffer of p
rows (α, β, step times), each rank filling its own row and zeros elsewhere
(so the sum is exact and bit-identical everywhere), and all use the **largest** α and the largest β
(synchronous steps go at the pace of the slowest link).

Cost (one node): with the default ``repeats=5``, 6 runs (1 warm-up) of 20 steps of
8 B, 4 of 1 MiB and 4 of 4 MiB: 168 messages and 60 MiB sent per rank, 15
barriers, and one small all-reduce: about 0.1 s with 2 ranks and 0.3 s
with 4 ranks on this 2-core machine (oversubscribed, so every step
waits for a core), once per communicator: the result is cached in
``comm.slots.probe``.

Example::

    >>> from commrt.probe import probe                      # doctest: +SKIP
    >>> r = probe(comm)          # collective: every rank calls it    # doctest: +SKIP
    >>> r.alpha_s, r.beta_s_per_byte, r.network()                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from commrt.schedule import Collective, Op, OpKind, Schedule, Step, Steps
from commrt.sim import Network

__all__ = ["ProbeResult", "probe", "SIZES"]
#: probed message sizes in bytes; the first one measures α
SIZES = (8, 1 << 20, 4 << 20)
_MIN_BETA = 1e-13  # 10 TB/s: a floor so a noisy fit never gives zero or negative β


@dataclass(frozen=True)
class ProbeResult:
    """Agreed α (s/message) and β (s/byte) of this communicator's transport.

    One link class (``ranks_per_node == 1``): ``alpha_s``/``beta_s_per_byte``
    describe every link. Ranks spanning nodes: they describe links inside
    a node, ``inter_alpha_s``/``inter_beta_s_per_byte`` one NIC between
    nodes, shared by ``ranks_per_node`` ranks over ``nics_per_node`` NICs.
    """

    alpha_s: float
    beta_s_per_byte: float
    sizes: tuple[int, ...]
    step_s: tuple[float, ...]  # agreed (max over ranks) step time per size
    per_rank: tuple[tuple[float, float], ...]  # every rank's own (α, β)
    backend: str
    world_size: int
    seconds: float  # wall time the probe took on this rank
    ranks_per_node: int = 1
    inter_alpha_s: float | None = None
    inter_beta_s_per_byte: float | None = None
    inter_step_s: tuple[float, ...] = ()  # one message per node, per size
    shared_step_s: float | None = None  # every rank off-node at once, largest size
    nics_per_node: int = 1
    gamma_s_per_byte: float = 0.0  # agreed (max over ranks) reduction time per byte

    @property
    def two_tier(self) -> bool:
        return self.inter_alpha_s is not None

    def network(self) -> Network:
        """The :class:`~commrt.sim.Network` for the simulator and ``auto`` (two classes if
        probed)."""
        inter = (self.inter_alpha_s, self.inter_beta_s_per_byte) if self.two_tier else None
        return Network.from_probe(
            self.alpha_s,
            self.beta_s_per_byte,
            inter=inter,
            ranks_per_node=self.ranks_per_node,
            nics_per_node=self.nics_per_node,
            gamma_s_per_byte=self.gamma_s_per_byte,
        )

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
        head = f"probe ({self.backend}, {self.world_size} ranks, {self.seconds * 1e3:.0f} ms): "
        link = f"α = {self.alpha_s * 1e6:.1f} µs, β = 1/({self.bandwidth_gbps:.2f} GB/s)"
        if self.gamma_s_per_byte:
            link += f", adds at {1e-9 / self.gamma_s_per_byte:.2f} GB/s"
        if not self.two_tier:
            return head + link
        inter_gbps = 1e-9 / self.inter_beta_s_per_byte
        return (
            head + f"{self.ranks_per_node} ranks/node; inside a node {link}; between nodes "
            f"α = {self.inter_alpha_s * 1e6:.1f} µs, β = 1/({inter_gbps:.3f} GB/s) per NIC, "
            f"{self.nics_per_node} NIC(s)/node"
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
    a torus row phase). ``inter``: local rank 0 of each node shifts to local
    rank 0 of the next node (one message per node: the NIC alone).
    ``shared``: every rank shifts to its counterpart on the next node (all
    ranks of a node off-node at once, as in a torus column phase); its
    slowdown against ``inter`` says how many NICs the ranks share.
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


def _time_steps(comm, sched: Schedule, buf: torch.Tensor, repeats: int) -> float:
    run = comm.executor.run
    # waits as commrt.all_reduce waits, so α is the latency it sees
    kw = dict(timeout=comm.timeout, piece_bytes=comm.piece_bytes, spin_s=comm.spin_s)
    run(sched, buf, comm.transport, **kw)  # warm-up: plan, scratch, connections
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        run(sched, buf, comm.transport, **kw)
        times.append((time.perf_counter() - t0) / sched.num_steps)
    return min(times)


def _time_reduce(comm, nbytes: int, repeats: int) -> float:
    """Seconds per byte of the executor's reduction: add ``nbytes`` of float32 into as many."""
    half = max(1, nbytes // 4)
    buf = torch.zeros(2 * half, dtype=torch.float32, device=comm.device)
    dst, src = buf[half:], buf[:half]
    sync = torch.cuda.synchronize if buf.device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        sync()
        t0 = time.perf_counter()
        comm.executor.reduce(dst, src)
        sync()
        times.append(time.perf_counter() - t0)
    return min(times[1:]) / (half * buf.element_size())


def _fit(sizes, times, gamma: float = 0.0) -> tuple[float, float]:
    """(α, β): the first size's time, and the slope over the others less ``gamma`` (each
    probe step adds what it receives, so its slope includes the reduction)."""
    alpha = max(float(times[0]), 0.0)
    s = np.asarray(sizes[1:], dtype=np.float64)
    t = np.asarray(times[1:], dtype=np.float64) - alpha
    beta = float((s * t).sum() / (s * s).sum()) - gamma if len(s) else _MIN_BETA
    return alpha, max(beta, _MIN_BETA)


def _measure(comm, nxt, ranks, sizes, repeats, big_steps=4) -> list[float]:
    """This rank's fastest step time per size for the shift ``nxt`` over ``ranks`` (0 if not
    in it)."""
    out = []
    for nb in sizes:
        # two chunks of nb bytes: one goes out, the other takes the incoming sum
        buf = torch.zeros(2 * max(1, nb // 4), dtype=torch.float32, device=comm.device)
        sched = _shift_schedule(comm.world_size, 20 if nb <= 4096 else big_steps, nxt, ranks)
        out.append(_time_steps(comm, sched, buf, repeats))
    return out


def _nics(per_node: int, alone_s: float, shared_s: float, alpha_s: float) -> int:
    """NICs per node from how much slower a node's ranks go off-node together than one alone
    (same message size): L ranks on one NIC take L times as long, on L NICs as long."""
    slowdown = max(shared_s - alpha_s, 1e-12) / max(alone_s - alpha_s, 1e-12)
    estimate = per_node / max(slowdown, 1e-9)
    # nearest on a log scale: 1.3 NICs' worth of slowdown is 1 NIC, not a tie-break of round()
    return min(range(1, per_node + 1), key=lambda k: abs(math.log(k / estimate)))


def _measured_row(comm, sizes, repeats: int, per_node: int | None, gamma: float) -> list:
    """This rank's fits and step times: one tier, or both (within and between nodes)."""
    if per_node is None:
        mine = _measure(comm, None, None, sizes, repeats)
        return [*_fit(sizes, mine, gamma), *mine, gamma]
    tiers = _tier_schedules(comm.world_size, per_node)
    intra = _measure(comm, *tiers["intra"], sizes, repeats)
    # Fewer and smaller messages between nodes: there the link is the slow one.
    inter = _measure(comm, *tiers["inter"], sizes[1:], repeats, big_steps=2)
    shared = _measure(comm, *tiers["shared"], sizes[:: len(sizes) - 1], repeats, big_steps=2)
    inter = [shared[0], *inter]
    return [
        *_fit(sizes, intra, gamma),
        *intra,
        *_fit(sizes, inter, gamma),
        *inter,
        shared[1],
        gamma,
    ]


def _agreed_result(rows, sizes, per_node: int | None, backend: str, elapsed_s: float):
    """Everyone's rows (the same on every rank) as one ProbeResult."""
    k, p = len(sizes), len(rows)

    def agreed(i):  # column i, largest over ranks: synchronous steps go at the slowest pace
        return max(r[i] for r in rows)

    res = ProbeResult(
        agreed(0),
        agreed(1),
        sizes,
        tuple(agreed(2 + i) for i in range(k)),
        tuple((r[0], r[1]) for r in rows),
        backend,
        p,
        elapsed_s,
        gamma_s_per_byte=agreed(-1),
    )
    if per_node is None:
        return res
    j = 2 + k
    inter_step = tuple(agreed(j + 2 + i) for i in range(k))
    shared = agreed(j + 2 + k)
    return dataclasses.replace(
        res,
        ranks_per_node=per_node,
        inter_alpha_s=agreed(j),
        inter_beta_s_per_byte=agreed(j + 1),
        inter_step_s=inter_step,
        shared_step_s=shared,
        nics_per_node=_nics(per_node, inter_step[-1], shared, agreed(j)),
    )


def probe(comm, *, sizes=SIZES, repeats: int = 5, force: bool = False) -> ProbeResult:
    """Measure α and β on ``comm``'s transport and agree on them (collective; cached).

    Every rank must call it, in the same order relative to other
    collectives (``algorithm="auto"`` does so inside ``select``). The
    result is cached in ``comm.slots.probe``; ``force`` probes
    again. When the launcher says the ranks span nodes (``comm.local_size``
    L with 1 < L < p, ranks in blocks of L), both link classes are
    measured (module doc).
    """
    cached = comm.slots.probe
    if cached is not None and not force:
        return cached
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or sorted(sizes) != list(sizes) or sizes[0] < 4:
        raise ValueError(
            f"probe sizes must be increasing, at least two, from 4 bytes up; got {sizes}"
        )
    t_start = time.perf_counter()
    p = comm.world_size
    from commrt.rows import gather
    from commrt.topology import ranks_per_node

    comm.admit_collective()
    with comm.lock:
        if p == 1:
            res = ProbeResult(
                0.0,
                _MIN_BETA,
                sizes,
                tuple(0.0 for _ in sizes),
                ((0.0, _MIN_BETA),),
                comm.backend.value,
                1,
                0.0,
            )
            comm.slots.probe = res
            return res
        # the reduction's own pace (no messages), taken out of the fitted slopes below
        gamma = _time_reduce(comm, sizes[-1], repeats)
        per_node = ranks_per_node(comm)
        rows = gather(comm, _measured_row(comm, sizes, repeats, per_node, gamma))
    res = _agreed_result(rows, sizes, per_node, comm.backend.value, time.perf_counter() - t_start)
    comm.slots.probe = res
    return res
