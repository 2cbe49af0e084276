"""Backup workers behind the GradientSync seam: first N of N + b gradients per global step.

Every rank holds a *global step* g: the number of global updates its
parameters and optimizer state contain. Ranks agree on each step through
the control store (:mod:`commrt.store`), nothing else central:

1. **Arrival.** When a rank's first bucket of the step is ready
   (:meth:`BackupPolicy.begin_step`), it takes a ticket with the store's
   atomic ``add`` on the key of step g and writes its rank under that
   ticket. Tickets 1..N are the step's participants; every rank reads the
   same N names, so all agree on who takes part. Arrival is "backward has
   begun producing gradients", so the rest of backward still overlaps the
   all-reduce; a delay that falls after the first bucket is ready is not
   seen.
2. **On time** (ticket <= N): the gradients are scaled by 1/N in the pack
   pass and the inner all-reduce runs over exactly those N ranks
   (``schedule(p, ranks=...)`` on the existing communicator). At
   ``sync.step(optimizer)`` the optimizer steps: the rank now holds g + 1.
3. **Late** (ticket > N): the gradient is dropped (nothing goes on the
   wire), and the rank posts a catch-up request. At ``sync.step`` it
   receives a *snapshot* — parameters and every optimizer state tensor,
   flattened, bit for bit — from an on-time rank and loads it, so it holds
   exactly what the on-time ranks held after the latest global step they
   finished, and computes its next gradient there. ``sync.step`` returns
   the number of global updates that jumped over (0 or more).

**Serving a snapshot costs an on-time rank a copy.** Requests are answered
in ``sync.step`` right after the optimizer step (so the state is the
freshest there is): the first on-time rank to see a request claims it
(atomic ``add``), copies its state into a send buffer and starts
non-blocking sends; later steps only check, through the store, whether the
late rank has received it. On MPI and gloo the sends start at once (the
engine holds them until the late rank posts its receive). On stream-ordered
transports (NCCL) a send would occupy the transport stream until its
receiver arrives, ahead of the on-time rank's next all-reduce; there the
server starts the send only after the late rank has posted its receive
(it says so through the store), so the send cannot wait on the late rank
and costs the on-time rank the transfer of one snapshot. That path is
correct by construction and exercised here with ``send_when_ready``
on MPI; it has not run on a GPU.

**Memory bound.** A snapshot is the parameters plus the optimizer state
(SGD with momentum: 2x the parameters; Adam: 3x). An on-time rank serves at
most ``max(1, b)`` snapshots at once (each in its own buffer, freed when
the receiver confirms); past that bound it claims no more requests and
another on-time rank answers them, or the late rank waits (up to the
timeout). A late rank keeps one receive buffer. Nothing else is kept: no
history of gradients.

**Dead ranks.** Up to b ranks that stop between steps never arrive, so the
others still find N arrivals per step and go on; a heartbeat (a store
counter every 0.25 s) that stops moving for ``dead_after_s`` marks a rank
missing in the stats. With more than b dead, a step never gets N arrivals
and the waiting ranks raise :class:`~commrt.CommTimeoutError` after the
timeout, naming the ranks that never arrived. A rank that dies *inside* a
step's all-reduce (after taking one of the N tickets) fails that step for
its peers with the usual timeout error; the paper's parameter server has
the same window.

**Control-plane cost.** Per step a rank makes about five store round trips
(ticket, name, poll for the N names, read them, look for requests): tens to
hundreds of microseconds on one machine. Each heartbeat thread reads all p
counters every 0.25 s, so the store (one server) sees O(p²) reads per
quarter second: fine for tens to a few hundred ranks, the limit beyond.

**Ending.** The first rank to call ``close()`` ends training at the global
step it holds: it takes a ticket on that step marked "closing", and a step
whose first N tickets include one makes no update. Every rank then ends at
that final state: ``close()`` keeps answering catch-up requests and returns
once every live rank holds it (ranks missing for ``dead_after_s`` are not
waited for; the wait is bounded by the timeout). Steps a rank takes after
the end are no-ops that return 0. When rank 0 hosts the store (no launcher
store), its ``close()`` also waits until every live rank has closed.

Requires ``sync.step(optimizer)`` (a late rank must load optimizer state);
``unused="error"``, ``broadcast_buffers=True`` and collectives between steps
involve every rank at once, which backup workers are meant to avoid.
"""
from __future__ import annotations

import contextlib
import enum
import json
import threading
import time
from dataclasses import dataclass, field

import torch

from commrt.algorithms.auto import Auto, label
from commrt.algorithms.torus import Torus2D
from commrt.errors import CommError, CommTimeoutError
from commrt.store import ControlStore, Host
from commrt.sync.policy import Policy, SyncContext

#: message tag of catch-up snapshots (executor tags are step * 1024 + piece)
CATCHUP_TAG = 0x3FFFFF00
#: bytes per catch-up message
PIECE_BYTES = 64 << 20
#: seconds between heartbeats
HEARTBEAT_S = 0.25
_ALIGN = 8
_INSTANCES = "commrt.backup.instances"


class Role(enum.Enum):
    ON_TIME = "on time"
    LATE = "late"
    FINAL = "after the end"   # training has ended; nothing to do


@dataclass
class BackupReport:
    """What backup workers did, as seen from one rank (``sync.policy.report()``).

    ``dropped`` and ``updates`` are per rank, filled in for every rank that
    reached the final state (after ``close()``); ``missing`` are ranks that
    never did (dead, or gone silent for ``dead_after_s``).
    """

    rank: int
    world_size: int
    backups: int
    global_step: int
    final_step: int | None
    dropped: dict[int, int] = field(default_factory=dict)
    updates: dict[int, int] = field(default_factory=dict)
    missing: tuple[int, ...] = ()
    served: int = 0
    #: seconds ``close()`` spent ending training and waiting for the others to hold the end
    drain_s: float = 0.0


@dataclass
class _Send:
    req: int
    peer: int
    flat: torch.Tensor
    started: float
    pending: object = None


def _pieces(flat: torch.Tensor) -> list[torch.Tensor]:
    return [flat[i:i + PIECE_BYTES] for i in range(0, flat.numel(), PIECE_BYTES)] or [flat]


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise CommError(f"commrt: catch-up snapshot names an unknown dtype {name!r}")
    return dt


def snapshot_layout(params: list[torch.Tensor], optimizer) -> dict:
    """What a snapshot of ``params`` and ``optimizer``'s state holds, in order (JSON-able)."""
    tensors, values = [], []
    for j, p in enumerate(params):
        st = optimizer.state.get(p, {}) if optimizer is not None else {}
        for key in sorted(st, key=str):
            v = st[key]
            if torch.is_tensor(v):
                tensors.append([j, str(key), str(v.dtype), list(v.shape), v.device.type == "cpu"])
            else:
                values.append([j, str(key), v])
    total = sum(_aligned(p.numel() * p.element_size()) for p in params)
    total += sum(_aligned(_dtype(d).itemsize * int(torch.Size(s).numel()))
                 for _, _, d, s, _ in tensors)
    return {"optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "tensors": tensors, "values": values, "nbytes": total}


def _views(flat: torch.Tensor, params, layout):
    """(destination description, view of ``flat``) for every tensor of the snapshot."""
    out, o = [], 0
    for p in params:
        nb = p.numel() * p.element_size()
        out.append((("param", p), flat[o:o + nb].view(p.dtype).view(p.shape)))
        o += _aligned(nb)
    for j, key, d, shape, cpu in layout["tensors"]:
        dt = _dtype(d)
        nb = dt.itemsize * int(torch.Size(shape).numel())
        out.append((("state", j, key, cpu), flat[o:o + nb].view(dt).view(shape)))
        o += _aligned(nb)
    return out


def pack_snapshot(params, optimizer, flat: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Copy parameters and optimizer state into one flat byte buffer; return it and its layout."""
    layout = snapshot_layout(params, optimizer)
    if flat is None or flat.numel() != layout["nbytes"]:
        flat = torch.empty(layout["nbytes"], dtype=torch.uint8, device=params[0].device)
    with torch.no_grad():
        for (kind, *where), view in _views(flat, params, layout):
            if kind == "param":
                view.copy_(where[0].detach())
            else:
                j, key, _ = where
                view.copy_(optimizer.state[params[j]][_key(optimizer.state[params[j]], key)])
    return flat, layout


def load_snapshot(flat: torch.Tensor, layout: dict, params, optimizer) -> None:
    """Overwrite ``params`` and ``optimizer``'s state with a snapshot, bit for bit."""
    if optimizer is not None and layout["optimizer"] not in (None, type(optimizer).__name__):
        raise ValueError(f"commrt: the catch-up snapshot comes from a {layout['optimizer']} but "
                         f"this rank steps a {type(optimizer).__name__}: every rank must use the "
                         f"same optimizer")
    with torch.no_grad():
        for (kind, *where), view in _views(flat, params, layout):
            if kind == "param":
                where[0].copy_(view)
            elif optimizer is not None:
                j, key, cpu = where
                st = optimizer.state[params[j]]
                k = _key(st, key)
                cur = st.get(k)
                if torch.is_tensor(cur) and cur.shape == view.shape and cur.dtype == view.dtype:
                    cur.copy_(view)
                else:
                    st[k] = view.to("cpu" if cpu else params[j].device, copy=True)
        if optimizer is not None:
            for j, key, v in layout["values"]:
                st = optimizer.state[params[j]]
                st[_key(st, key)] = v


def _key(state: dict, key: str):
    # state keys are strings for every torch optimizer; keep a non-string key's identity
    for k in state:
        if str(k) == key:
            return k
    return key


class BackupPolicy(Policy):
    """The backup-workers family (see the module docs for the protocol)."""

    #: start catch-up sends only once the late rank has posted its receive (stream-ordered
    #: transports need this; tests set it to run that path on MPI)
    send_when_ready: bool | None = None

    def setup(self, ctx: SyncContext) -> tuple[str, ...]:
        self.ctx = ctx
        comm = ctx.comm
        alg = self.algorithm
        self.rank, self.p = comm.rank, comm.world_size
        self.n = alg.participants(self.p)        # ValueError on every rank when p <= b
        self.timeout = comm.timeout
        inner = [self._inner_for(b.numel * ctx.element_size) for b in ctx.buckets]
        for a in dict.fromkeys(inner):   # a shape that does not fit N fails here, everywhere
            a.schedule(self.p, tuple(range(self.n)))
        self.inner = inner
        # MPI moves a message only inside MPI calls (MPICH runs no progress thread by default),
        # so a server tests its pending snapshot sends whenever it checks on them; gloo and NCCL
        # progress on their own, and a gloo wait that times out breaks the connection: never polled
        self._host_progress = comm.transport.name == "mpi"
        if self.send_when_ready is None:
            self.send_when_ready = bool(comm.transport.stream_ordered)
        instance = comm.cache.get(_INSTANCES, 0)
        comm.cache[_INSTANCES] = instance + 1
        self.cs = ControlStore.open(comm)
        self.prefix = f"commrt/backup/{instance}"
        self.store = self.cs.client(self.prefix)
        self.params = [p for b in ctx.buckets for p in b.params]
        self.held = 0                # global step this rank's state holds
        self.final: int | None = None
        self.role = Role.ON_TIME
        self.ranks: tuple[int, ...] = ()
        self._schedules: list = []
        self._req: int | None = None
        self._opt = None
        self._unapplied = False
        self._failed = False
        self._closed = False
        self._fin_marked = False
        self.dropped = 0
        self.updates = 0
        self.served = 0
        self._seen_req = 0
        self._open_reqs: dict[int, tuple[int, int]] = {}
        self._sending: list[_Send] = []
        self._lost: list = []   # buffers of transfers whose peer vanished: the engine may hold them
        self._rbuf: torch.Tensor | None = None
        self._state_event = None
        self._report: BackupReport | None = None
        self._stale: frozenset[int] = frozenset()
        self._stop = threading.Event()
        self._hb = threading.Thread(target=self._heartbeat, name=f"commrt-backup-hb-r{self.rank}",
                                    daemon=True)
        self._hb.start()
        return tuple(f"backup(b={alg.backups}):{label(a)}" for a in inner)

    def _inner_for(self, nbytes: int):
        inner = self.algorithm.inner
        if isinstance(inner, Auto):   # priced for the N ranks that take part (probes: collective)
            return inner.choose(self.n, nbytes, self.ctx.comm).algorithm
        if isinstance(inner, Torus2D) and inner.rows is None and inner.cols is None:
            return Torus2D(*inner.shape(self.n))
        return inner

    # ------------------------------------------------------------ per step
    def begin_step(self, step: int) -> None:
        try:
            self._begin()
        except BaseException:
            self._failed = True
            raise

    def _begin(self) -> None:
        if self._unapplied:
            raise RuntimeError("commrt: backup workers need sync.step(optimizer) after every "
                               "backward (a late rank loads the latest parameters and optimizer "
                               "state there); sync.wait() followed by optimizer.step() cannot")
        g = self.held
        if self.final is not None and g >= self.final:
            self.role, self.ranks = Role.FINAL, ()
            return
        self._unapplied = True
        with self._span("commrt/backup/arrive", step=g):
            pos = self.store.add(f"a/{g}", 1)
            self.store.set(f"s/{g}/{pos - 1}", str(self.rank))
            firsts = self._first_n(g)
        if any(s.startswith("x") for s in firsts):
            self.final, self.role, self.ranks = g, Role.FINAL, ()
        elif pos <= self.n:
            self.role = Role.ON_TIME
            self.ranks = tuple(sorted(int(s) for s in firsts))
            self._schedules = [a.schedule(self.p, self.ranks) for a in self.inner]
        else:
            self.role, self.ranks = Role.LATE, tuple(sorted(int(s) for s in firsts))
            self.dropped += 1
            self._req = self._request(g)

    def _first_n(self, g: int) -> list[str]:
        """The names under tickets 1..N of step ``g`` (waits for them, bounded).

        While it waits, this rank answers catch-up requests: a rank that is
        still catching up may be one of the N this step waits for."""
        keys = [f"s/{g}/{i}" for i in range(self.n)]
        if not self._poll(lambda: self.store.check(keys), serve=True):
            raise self._arrival_timeout(g)
        return [v.decode() for v in self.store.multi_get(keys)]

    def _poll(self, done, serve: bool = False) -> bool:
        """Call ``done()`` (a store query) with growing pauses until it is true or the
        timeout passes."""
        deadline = time.monotonic() + self.timeout
        pause, next_serve = 0.0, 0.0
        while not done():
            now = time.monotonic()
            if now > deadline:
                return False
            if serve and now >= next_serve:
                self._serve()
                next_serve = now + 0.005
            time.sleep(pause)
            pause = min(2e-3, 2 * pause + 1e-4)
        return True

    def _arrival_timeout(self, g: int) -> CommTimeoutError:
        # a fresh connection: the timed-out one may still receive the late reply
        store = self.cs.client(self.prefix)
        count = int(store.add(f"a/{g}", 0))
        arrived = set()
        for i in range(count):
            if store.check([f"s/{g}/{i}"]):
                arrived.add(int(store.get(f"s/{g}/{i}").decode().lstrip("x")))
        missing = sorted(set(range(self.p)) - arrived)
        self._failed = True
        return CommTimeoutError(
            rank=self.rank, peer=missing[0] if missing else None, timeout_s=self.timeout,
            algorithm=str(self.algorithm), step=g,
            what=(f"the first {self.n} of {self.p} gradients of global step {g}; only "
                  f"{len(arrived)} ranks arrived, missing ranks {missing} (more than "
                  f"backups={self.algorithm.backups} gone)"))

    def scale(self, step: int) -> float:
        return 1.0 / self.n

    def communicate(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        if self.role is not Role.ON_TIME:
            return 0          # a late gradient is dropped: nothing goes on the wire
        return self.ctx.run(self._schedules[bucket], buf, bucket)

    def apply(self, optimizer: torch.optim.Optimizer) -> int:
        self._opt = optimizer
        self._unapplied = False
        if self.role is Role.ON_TIME:
            optimizer.step()
            self._record_state()
            self.held += 1
            self.updates += 1
            self._serve()
            return 1
        if self.role is Role.LATE:
            req, self._req = self._req, None
            with self._span("commrt/backup/catch-up", step=self.held):
                return self._catch_up(req)
        self._mark_final()
        self._serve()
        return 0

    def step_stats(self) -> dict:
        return {"role": self.role.value, "participants": list(self.ranks), "dropped": self.dropped,
                "global_step": self.held, "missing": sorted(self._stale)}

    @property
    def global_step(self) -> int:
        return self.held

    @property
    def finished(self) -> bool:
        """Training has ended (a rank closed) and this rank holds the final state:
        further steps are no-ops, so a loop may stop."""
        return self.final is not None and self.held >= self.final

    @property
    def extra_bytes(self) -> int:
        held = [s.flat for s in self._sending] + ([self._rbuf] if self._rbuf is not None else [])
        return sum(t.numel() for t in held)

    # ------------------------------------------------------------ catch-up
    def _request(self, g: int) -> int:
        i = int(self.store.add("nreq", 1)) - 1
        self.store.set(f"q/{i}", f"{self.rank} {g}")
        return i

    def _catch_up(self, req: int) -> int:
        """Receive and load the snapshot answering request ``req``; return the updates gained.

        A server that dies while its snapshot is on the way (the engine reports the lost
        connection) is replaced: the request goes out again and another rank answers."""
        for _ in range(self.p):
            try:
                return self._receive(req)
            except CommError:
                raise
            except RuntimeError:
                if self._rbuf is not None:
                    self._lost.append(self._rbuf)   # the engine may still hold it
                self._rbuf = None
                req = self._request(self.held)
        return self._receive(req)

    def _receive(self, req: int) -> int:
        comm, tr = self.ctx.comm, self.ctx.comm.transport
        deadline = time.monotonic() + self.timeout
        if not self._poll(lambda: self.store.check([f"r/{req}"])):
            self._failed = True
            raise CommTimeoutError(rank=self.rank, peer=None, timeout_s=self.timeout,
                                   algorithm=str(self.algorithm), step=self.held,
                                   what="an on-time rank to answer its catch-up request")
        resp = json.loads(self.store.get(f"r/{req}"))
        server, layout = resp["server"], resp["layout"]
        nbytes = layout["nbytes"]
        if self._rbuf is None or self._rbuf.numel() != nbytes:
            self._rbuf = torch.empty(nbytes, dtype=torch.uint8, device=comm.device)
        flat = self._rbuf
        pieces = _pieces(flat)
        with comm.lock:
            tr.begin(flat)
            pend = tr.exchange([], [(x, server) for x in pieces], CATCHUP_TAG)
        self.store.set(f"k/{req}", "1")          # receive posted: a stream-ordered server may send
        for j in range(len(pieces)):
            if not pend.wait_recv(j, deadline):
                self._failed = True
                raise CommTimeoutError(rank=self.rank, peer=server, what="recv",
                                       timeout_s=self.timeout, step=self.held,
                                       algorithm=f"{self.algorithm} catch-up")
        pend.finish()
        if not tr.sync(deadline):
            raise CommTimeoutError(rank=self.rank, peer=server, what="recv", timeout_s=self.timeout,
                                   algorithm=f"{self.algorithm} catch-up", step=self.held)
        tr.end(flat)
        self.store.set(f"d/{req}", "1")
        load_snapshot(flat, layout, self.params, self._opt)
        self._record_state()
        gained = resp["step"] - self.held
        self.held = resp["step"]
        self.updates += gained
        if resp["final"] is not None:
            self.final = resp["final"]
        if self.final is not None and self.held >= self.final:
            self._mark_final()
        return gained

    def _serve(self) -> None:
        """Answer catch-up requests this rank can help with (a copy and non-blocking sends)."""
        if self._opt is None and self.p > 1:
            return
        self._progress_sends()
        n = int(self.store.add("nreq", 0))
        for i in range(self._seen_req, n):
            who, g = (int(x) for x in self.store.get(f"q/{i}").decode().split())
            if who != self.rank:
                self._open_reqs[i] = (who, g)
        self._seen_req = n
        for i, (who, g) in sorted(self._open_reqs.items()):
            if g >= self.held:
                continue              # this rank is no further than the requester
            if len(self._sending) >= max(1, self.algorithm.backups):
                break                 # memory bound: another on-time rank will answer
            del self._open_reqs[i]
            if int(self.store.add(f"c/{i}", 1)) != 1:
                continue              # claimed by another rank
            self._start_send(i, who)

    def _record_state(self) -> None:
        # a snapshot may be copied on the progress thread, on another stream: order it after the
        # optimizer step (and the loads) that produced this state
        if self.ctx.comm.device.type == "cuda":
            self._state_event = torch.cuda.Event()
            self._state_event.record(torch.cuda.current_stream(self.ctx.comm.device))

    def _span(self, name: str, **args):
        tracer = self.ctx.tracer
        return tracer.span(name, **args) if tracer is not None else contextlib.nullcontext()

    def _start_send(self, req: int, peer: int) -> None:
        if self._state_event is not None:
            torch.cuda.current_stream(self.ctx.comm.device).wait_event(self._state_event)
        with self._span("commrt/backup/snapshot", peer=peer):
            flat, layout = pack_snapshot(self.params, self._opt)
        self.store.set(f"r/{req}", json.dumps({"server": self.rank, "step": self.held,
                                               "final": self.final, "layout": layout}))
        s = _Send(req, peer, flat, time.monotonic())
        self._sending.append(s)
        self.served += 1
        if not self.send_when_ready:
            self._post(s)

    def _post(self, s: _Send) -> None:
        comm = self.ctx.comm
        with comm.lock:
            comm.transport.begin(s.flat)
            sends = [(x, s.peer) for x in _pieces(s.flat)]
            s.pending = comm.transport.exchange(sends, [], CATCHUP_TAG)

    def _progress_sends(self) -> None:
        now = time.monotonic()
        for s in list(self._sending):
            if s.pending is None:
                if self.store.check([f"k/{s.req}"]):
                    self._post(s)
                elif now - s.started > self.timeout:
                    self._sending.remove(s)          # the late rank never came for it
                continue
            if self._host_progress:
                for j in range(len(_pieces(s.flat))):
                    s.pending.wait_send(j, 0.0)      # one MPI_Test: moves the message along
            if self.store.check([f"d/{s.req}"]):
                deadline = now + self.timeout
                for j in range(len(_pieces(s.flat))):
                    s.pending.wait_send(j, deadline)
                self._sending.remove(s)
            elif now - s.started > self.timeout:
                self._sending.remove(s)              # receiver gone: keep the buffer for the engine
                self._lost.append(s.flat)

    # --------------------------------------------------------------- end
    def _mark_final(self) -> None:
        if self._fin_marked:
            return
        self._fin_marked = True
        self.store.set(f"fin/{self.rank}", json.dumps({"step": self.held, "dropped": self.dropped,
                                                       "updates": self.updates}))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self._failed:
                self._drain()
        finally:
            self._stop_heartbeat()

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        self._hb.join(timeout=self.timeout)

    def _drain(self) -> None:
        start = time.monotonic()
        deadline = start + self.timeout
        # 1. end training at the step this rank holds, or catch up to where it ended
        while self.final is None or self.held < self.final:
            g = self.held
            if self.final is None:
                pos = self.store.add(f"a/{g}", 1)
                self.store.set(f"s/{g}/{pos - 1}", f"x{self.rank}")
                if any(s.startswith("x") for s in self._first_n(g)):
                    self.final = g
                    break
            self._catch_up(self._request(g))
        self._mark_final()
        # 2. answer catch-up requests until every live rank holds the final state
        others = [r for r in range(self.p) if r != self.rank]
        fins: dict[int, dict] = {self.rank: {"step": self.held, "dropped": self.dropped,
                                             "updates": self.updates}}
        while True:
            self._serve()
            for r in others:
                if r not in fins and self.store.check([f"fin/{r}"]):
                    fins[r] = json.loads(self.store.get(f"fin/{r}"))
            waiting = [r for r in others if r not in fins and r not in self._stale]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        while self._sending and time.monotonic() < deadline:
            self._progress_sends()
            time.sleep(0.002)
        missing = tuple(r for r in range(self.p) if r not in fins)
        self._report = BackupReport(self.rank, self.p, self.algorithm.backups, self.held,
                                    self.final, {r: f["dropped"] for r, f in sorted(fins.items())},
                                    {r: f["updates"] for r, f in sorted(fins.items())}, missing,
                                    self.served, time.monotonic() - start)
        # 3. the store lives in this process: keep it up until every live rank is done with it
        self._stop_heartbeat()
        self.store.set(f"bye/{self.rank}", "1")
        if self.cs.where is Host.RANK0 and self.cs.hosted_here:
            live = [r for r in others if r not in missing]
            while time.monotonic() < deadline and not self.store.check([f"bye/{r}" for r in live]):
                time.sleep(0.01)

    def report(self) -> BackupReport:
        """What happened (complete after ``close()``; before, this rank's numbers only)."""
        if self._report is not None:
            return self._report
        return BackupReport(self.rank, self.p, self.algorithm.backups, self.held, self.final,
                            {self.rank: self.dropped}, {self.rank: self.updates},
                            tuple(sorted(self._stale)), self.served)

    # ----------------------------------------------------------- heartbeat
    def _heartbeat(self) -> None:
        try:
            store = self.cs.client(self.prefix)
        except RuntimeError:
            return
        keys = [f"hb/{r}" for r in range(self.p)]
        seen: dict[int, int] = {}
        changed = {r: time.monotonic() for r in range(self.p)}
        while not self._stop.wait(HEARTBEAT_S):
            try:
                store.add(keys[self.rank], 1)
                vals = [int(store.add(k, 0)) for k in keys]
            except RuntimeError:     # the store went away (its host ended): nothing more to watch
                return
            now = time.monotonic()
            for r, v in enumerate(vals):
                if seen.get(r) != v:
                    seen[r], changed[r] = v, now
            limit = self.algorithm.dead_after_s
            self._stale = frozenset(r for r in range(self.p)
                                    if r != self.rank and now - changed[r] > limit)
