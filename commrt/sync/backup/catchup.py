"""Catch-up: a late rank asks for the latest state, an on-time rank sends it.

**Requests.** A late rank numbers its request with the store's atomic
``add`` and writes ``"{rank} {step it holds}"`` under it.

**Serving costs an on-time rank a copy.** Requests are answered right
after the optimizer step (so the state is the freshest there is), and
while a rank waits for a step's arrivals: the first on-time rank to see a
request claims it (atomic ``add``), copies its state into a send buffer
(:func:`~commrt.sync.snapshot.pack_snapshot`), publishes the
layout and starts non-blocking sends; later calls only check, through the
store, whether the late rank has received it. On MPI and gloo the sends
start at once (the engine holds them until the late rank posts its
receive). On stream-ordered transports (NCCL) a send would occupy the
transport stream until its receiver arrives, ahead of the on-time rank's
next all-reduce; there the server starts the send only after the late
rank has said, through the store, that it is posting its receive, so the
send cannot wait on the late rank and costs the on-time rank the transfer
of one snapshot.

**NCCL's rules.** NCCL sets up a pair's connection inside ``groupEnd()``
the first time the two exchange, and that ``groupEnd`` returns only once
the peer has reached its matching group; backup workers' inner ring may
never have connected a server to the late rank. So the late rank writes
its mark *before* its receive's ``groupEnd``: written after, the late
rank would wait in ``groupEnd`` for a send the server starts only once it
sees the mark (a deadlock, holding the communicator's lock). NCCL cannot
cancel an operation either, so on a stream-ordered transport a failed or
timed-out transfer is never retried behind the stuck one: the error is
raised (the transport aborts its communicator). So a server that dies
between answering and sending costs its late rank the communicator (a
``CommError`` as soon as the death is recorded, about ``dead_after_s``
after it), where gloo asks again. The receive (its ``groupEnd`` and its
wait) runs whole on a thread, watched for the server's death, never in
short waits: an NCCL wait that passes its deadline aborts the
communicator, which a slice of 0.25 s did whenever the server sent later
than that (it sends when it next looks at its requests: after its
optimizer step or while it waits for arrivals). Both rules are checked by
the strict NCCL stand-in (tests/helpers/nccl_strict.py, tests/multiprocess/test_nccl_strict.py)
on CPU; this path has not run on a GPU.

**Memory bound.** A snapshot is the parameters plus the optimizer state
(SGD with momentum: 2x the parameters; Adam: 3x). An on-time rank serves
at most ``max(1, b)`` snapshots at once (each in its own buffer, freed
when the receiver confirms); past that bound it claims no more requests
and another on-time rank answers them, or the late rank waits (up to the
timeout). A late rank keeps one receive buffer.

Both sides move the snapshot as one :class:`~commrt.schedule.p2p.Exchange` of
:data:`~commrt.sync.snapshot.PIECE_BYTES` pieces under the tag
:data:`commrt.schedule.tags.CATCHUP`.

**A rejoined end** (:mod:`commrt.sync.backup.rejoin`). The communicator's
gloo group cannot reach a replacement process, so when either end is an
incarnation >= 1 (the request and the response say which) the snapshot
travels on a two-rank gloo group made for that request
(:meth:`Keys.pair <commrt.sync.backup.keys.Keys.pair>`), once the late rank
has posted its receive: both are then at the rendezvous within
milliseconds. The group is closed when the transfer ends.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from functools import partial

import torch

from commrt.errors import CommError, CommTimeoutError
from commrt.runtime.polling import poll
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where, timeout_error
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.watched import MemberRecordedDead, WaiterSlot
from commrt.sync.backup.wire import Wire
from commrt.sync.snapshot import load_snapshot, pack_snapshot, pieces

#: how often a late rank waiting for a snapshot asks whether its server was recorded dead
CHECK_S = 0.25


class ServerDied(RuntimeError):
    """The rank serving this late rank's snapshot was recorded dead (the request goes out
    again, as after an engine error)."""


def span(tracer, name: str, **args):
    """``tracer``'s span, or nothing when there is no tracer."""
    return tracer.span(name, **args) if tracer is not None else contextlib.nullcontext()


class _ServerWatch:
    """A late rank's watch on its catch-up server (rank, incarnation): the blocking calls it
    runs end with :class:`ServerDied` once the server is recorded dead (so
    :meth:`CatchUp.receive` asks again, or on NCCL gives up): gloo does not always report a
    peer killed before its send began, and the wait would last the whole timeout
    (tools/chaos_backup.py exercises this). Where a wait that times out breaks the
    connection (gloo closes the pair, NCCL aborts the communicator) a call runs whole on a
    thread of ``waiters`` (:mod:`commrt.sync.backup.watched`); elsewhere (MPI) waits are cut
    into slices."""

    def __init__(self, store, server: tuple[int, int], waiters: WaiterSlot, whole: bool):
        self.store, self.server, self.waiters, self.whole = store, server, waiters, whole
        self._dead = [Keys.dead(*server)]

    def gone(self) -> bool:
        return self.store.check(self._dead)

    def death_error(self) -> ServerDied:
        """The error to raise once :meth:`gone` says the server died."""
        return ServerDied(f"catch-up server rank {self.server[0]} was recorded dead")

    def run(self, fn):
        """``fn()``, whole on the thread where waits must not be cut (else here)."""
        if not self.whole:
            return fn()
        try:
            return self.waiters.get().wait(fn, self.gone, CHECK_S)
        except MemberRecordedDead:
            raise self.death_error() from None

    def take(self, exchange: Exchange, deadline: float) -> None:
        """Wait for the snapshot's pieces. On a device stream (NCCL on CUDA) a receive's
        wait returns at once (it completes in stream order) and the host waits in the
        transport's ``sync``: that wait runs watched too, or a server dead within a node,
        which NCCL does not report (NVIDIA/nccl#585), would cost the whole timeout."""
        for i in range(len(exchange.recvs)):
            if self.whole:
                if not self.run(partial(exchange.pending.wait_recv, i, deadline)):
                    exchange.wait_recv(i, deadline)  # raises the named timeout
                continue
            while not exchange.pending.wait_recv(i, min(deadline, time.monotonic() + CHECK_S)):
                if time.monotonic() >= deadline:
                    exchange.wait_recv(i, deadline)  # raises the named timeout
                if self.gone():
                    raise self.death_error()
        tr = exchange.transport
        if self.whole and tr.stream_ordered:
            if not self.run(_as_caller(tr.device, partial(tr.sync, deadline))):
                peer = exchange.recvs[0][1]
                raise timeout_error(tr.rank, "recv", peer, exchange.comm.timeout, exchange.where)
        exchange.complete(deadline)


def _as_caller(device: torch.device, fn):
    """``fn`` made to run on another thread as it would on this one: on CUDA with this
    thread's current device and stream (both are per thread), which order its work."""
    if device.type != "cuda":
        return fn
    stream = torch.cuda.current_stream(device)

    def run():
        with torch.cuda.device(device), torch.cuda.stream(stream):
            return fn()

    return run


def _stuck_receive(transport, rank: int, e: Exception) -> CommError:
    """The error for a catch-up receive that failed on NCCL, which cannot cancel it. The
    communicator is aborted now: the receive would hold the stream, and the wait given up
    on its thread, until the timeout (and could write the buffer later)."""
    transport.abort(f"catch-up receive failed ({e})")
    return CommError(
        f"commrt: rank {rank}: catch-up receive failed ({e}); NCCL cannot cancel it, so "
        "the communicator was aborted and the receive is not retried"
    )


def _pair_wire(where, store, req: int, peer: tuple[int, int], rank: int, timeout) -> Wire:
    """The two-rank group request ``req`` travels on (one end rejoined; ``where``: control
    store and key space); making it ends once ``peer`` (rank, incarnation) is recorded dead."""
    dead = Keys.dead(*peer)
    members = tuple(sorted((peer[0], rank)))
    return Wire(*where, Keys.pair(req), members, rank, timeout, (), lambda: store.check([dead]))


def _check_claimer(store, req: int) -> None:
    """Raise :class:`ServerDied` if the rank that claimed request ``req`` was recorded dead
    before answering it (nobody else would; tools/chaos_backup.py exercises this)."""
    if store.check([Keys.claim(req)]):
        server, inc = (int(x) for x in store.get(Keys.claim(req)).split())
        if store.check([Keys.dead(server, inc)]) and not store.check([Keys.response(req)]):
            raise ServerDied(f"rank {server} claimed catch-up request {req} and died")


def _start(c: "CatchUp", req: int, peer: int, flat, step: int, pair: int | None, send: bool):
    """Start moving ``flat`` to (``send``) or from ``peer`` for ``c``'s request ``req``; return the
    exchange and, with ``pair`` (the peer's incarnation), the two-rank group it runs on."""
    wire = None
    if pair is not None:
        wire = _pair_wire(c.pairs, c.store, req, (peer, pair), c.rank, c.timeout)
    at = peer if wire is None else wire.members.index(peer)
    moves = [(x, at) for x in pieces(flat)]
    sends, recvs = (moves, []) if send else ([], moves)
    transport = None if wire is None else wire.transport
    where = Where(f"{c.algorithm} catch-up", step=step)
    return Exchange(c.comm, sends, recvs, tags.CATCHUP, where, transport=transport), wire


@dataclass(eq=False)  # identity: a list lookup must not compare tensors
class _Send:
    """One snapshot on its way to a late rank."""

    req: int
    peer: int
    flat: torch.Tensor
    step: int  # the global step the snapshot holds
    started: float
    exchange: Exchange | None = None  # None until the sends start
    #: on a two-rank group of its own (one end rejoined): the peer's incarnation, else None
    pair: int | None = None
    wire: Wire | None = None  # that group, once made


class CatchUp:
    """Catch-up requests, serving them and receiving an answer, for one policy."""

    def __init__(self, comm, store, params, algorithm, tracer=None, incarnation=0, pairs=None):
        self.comm, self.store, self.params = comm, store, params
        #: this rank's incarnation (>= 1: a replacement, reached only on pair groups)
        self.incarnation = incarnation
        self.pairs = pairs  # (control store, key space): where pair groups meet
        self.algorithm, self.tracer = algorithm, tracer
        self.rank, self.p, self.timeout = comm.rank, comm.world_size, comm.timeout
        self.served = 0  # snapshots this rank has served
        # MPICH (cuda_ipc) moves a message only inside calls: a server tests its sends
        self._host_progress = comm.transport.name in ("mpi", "cuda_ipc")
        self._seen = 0  # requests read from the store so far
        self._open: dict[int, tuple[int, int, int]] = {}  # unanswered: req -> (rank, step, inc)
        self._sending: list[_Send] = []
        self._lost: list = []  # buffers of transfers whose peer vanished: the engine may hold them
        self._rbuf: torch.Tensor | None = None  # the late side's receive buffer
        self._next_claim_check = 0.0  # when the late side next looks at its request's claim
        self._state_event = None  # when this rank's state was last written
        self._waiters = WaiterSlot()  # runs a receive's gloo and NCCL waits (``_ServerWatch``)

    def close(self) -> None:
        """End the thread a receive's waits ran on."""
        self._waiters.close()

    @property
    def busy(self) -> bool:
        """Snapshots are still on their way."""
        return bool(self._sending)

    @property
    def held_bytes(self) -> int:
        held = [s.flat for s in self._sending] + ([self._rbuf] if self._rbuf is not None else [])
        return sum(t.numel() for t in held)

    def record_state(self) -> None:
        """This rank's parameters or optimizer state were just written (by the caller's stream)."""
        # a snapshot may be copied on the progress thread, on another stream: order it after the
        # optimizer step (and the loads) that produced this state
        if self.comm.device.type == "cuda":
            self._state_event = torch.cuda.Event()
            self._state_event.record(torch.cuda.current_stream(self.comm.device))

    # ------------------------------------------------------------ the late side
    def request(self, step: int) -> int:
        """Ask for a snapshot newer than ``step`` (the global step this rank holds)."""
        i = int(self.store.add(Keys.REQUESTS, 1)) - 1
        self.store.set(Keys.request(i), f"{self.rank} {step} {self.incarnation}")
        return i

    def withdraw(self, req: int | None) -> None:
        """Withdraw request ``req`` (its rank takes part in a redone step after all) by
        claiming it, so that nobody serves it. No server can have claimed it: none holds a
        newer step while the step is being redone (:mod:`commrt.sync.backup.recovery`)."""
        if req is not None and not self._claim(req):
            raise CommError(f"commrt: rank {self.rank}: catch-up request {req} was served")

    def _claim(self, req: int) -> bool:
        """Take request ``req`` for this rank (once, whoever asks first); the claim names
        its rank, so a late rank can tell when its claimer died before answering."""
        mine = f"{self.rank} {self.incarnation}"
        return self.store.compare_set(Keys.claim(req), "", mine).decode() == mine

    def receive(self, req: int, step: int, optimizer) -> dict:
        """Receive and load the snapshot answering request ``req``; return its response
        (``step`` and ``final`` of the state it held).

        A server that dies while its snapshot is on the way (the engine reports the lost
        connection, or liveness records it dead) is replaced: the request goes out again
        and another rank answers."""
        for _ in range(self.p):
            try:
                return self._receive(req, step, optimizer)
            except CommError:
                raise
            except RuntimeError as e:
                if self.comm.transport.stream_ordered:  # the receive cannot be cancelled
                    raise _stuck_receive(self.comm.transport, self.rank, e) from e
                if self._rbuf is not None:
                    self._lost.append(self._rbuf)  # the engine may still hold it
                self._rbuf = None
                req = self.request(step)
        return self._receive(req, step, optimizer)

    def _receive(self, req: int, step: int, optimizer) -> dict:
        deadline = time.monotonic() + self.timeout
        if not poll(lambda: self._answered(req), self.timeout):
            raise CommTimeoutError(
                rank=self.rank,
                peer=None,
                timeout_s=self.timeout,
                algorithm=str(self.algorithm),
                step=step,
                what="an on-time rank to answer its catch-up request",
            )
        resp = json.loads(self.store.get(Keys.response(req)))
        layout = resp["layout"]
        if self._rbuf is None or self._rbuf.numel() != layout["nbytes"]:
            self._rbuf = torch.empty(layout["nbytes"], dtype=torch.uint8, device=self.comm.device)
        server = (resp["server"], resp.get("incarnation", 0))
        # the mark first: on NCCL this receive's groupEnd may wait for the server's send,
        # which a stream-ordered server starts only once it sees the mark (module docs)
        self.store.set(Keys.posted(req), "1")
        pair = server[1] if resp.get("pair") else None
        whole = pair is not None or self.comm.transport.waits_break_on_timeout  # pair: gloo
        watch = _ServerWatch(self.store, server, self._waiters, whole)
        # watched too: NCCL's groupEnd waits for the server's own when the two never
        # connected, and a server that died would hold it for the whole timeout
        start = partial(_start, self, req, server[0], self._rbuf, step, pair, False)
        exchange, wire = watch.run(_as_caller(self.comm.device, start))
        try:
            watch.take(exchange, deadline)
        finally:
            if wire is not None:
                wire.transport.close()
        self.store.set(Keys.received(req), "1")
        load_snapshot(self._rbuf, layout, self.params, optimizer)
        self.record_state()
        return resp

    def _answered(self, req: int) -> bool:
        """Whether request ``req`` has its response; raises :class:`ServerDied` if the rank
        that claimed it was recorded dead before answering (nobody else would;
        tools/chaos_backup.py exercises this). Looks at the claim at most every
        ``CHECK_S``."""
        if self.store.check([Keys.response(req)]):
            return True
        now = time.monotonic()
        if now >= self._next_claim_check:
            self._next_claim_check = now + CHECK_S
            _check_claimer(self.store, req)
        return False

    # ------------------------------------------------------------ the on-time side
    def serve(self, optimizer, step: int, final: int | None, send_now: bool) -> None:
        """Answer the requests this rank can help with: those of ranks behind ``step``, the
        global step it holds (``final``: where training ends, if known). ``send_now``: start
        the sends at once, rather than when the late rank has posted its receive."""
        if optimizer is None and self.p > 1:
            return
        self.progress()
        n = int(self.store.add(Keys.REQUESTS, 0))
        for i in range(self._seen, n):
            who, g, inc = (int(x) for x in self.store.get(Keys.request(i)).decode().split())
            if who != self.rank:
                self._open[i] = (who, g, inc)
        self._seen = n
        for i, (who, g, inc) in sorted(self._open.items()):
            if g >= step:
                continue  # this rank is no further than the requester
            if len(self._sending) >= max(1, self.algorithm.backups):
                break  # memory bound: another on-time rank will answer
            del self._open[i]
            if not self._claim(i):
                continue  # claimed by another rank
            pair = inc if inc or self.incarnation else None  # the job's group cannot reach it
            self._start_send(i, who, (step, final), optimizer, (send_now and pair is None, pair))

    def _start_send(self, req: int, peer: int, held: tuple, optimizer, how: tuple) -> None:
        """Answer request ``req`` of ``peer`` with this rank's state (``held``: its step and
        final); ``how``: (start the sends now, the peer's incarnation on a pair group)."""
        send_now, pair = how
        if self._state_event is not None:
            torch.cuda.current_stream(self.comm.device).wait_event(self._state_event)
        with span(self.tracer, "commrt/backup/snapshot", peer=peer):
            flat, layout = pack_snapshot(self.params, optimizer)
        step, final = held
        resp = {"server": self.rank, "step": step, "final": final, "layout": layout}
        resp.update(incarnation=self.incarnation, pair=pair is not None)
        self.store.set(Keys.response(req), json.dumps(resp))
        s = _Send(req, peer, flat, step, time.monotonic(), pair=pair)
        self._sending.append(s)
        self.served += 1
        if send_now:  # gloo fails the send at once if the late rank died since it asked
            self._guarded(s, self._post)

    def _post(self, s: _Send) -> None:
        """Start the sends of ``s`` (a pair group's peer posted its receive: it is there)."""
        s.started = time.monotonic()  # the receiver has the timeout from here to take it
        s.exchange, s.wire = _start(self, s.req, s.peer, s.flat, s.step, s.pair, True)

    def _give_up(self, s: _Send, held: bool = False) -> None:
        """Forget snapshot ``s``: its receiver is gone. Its buffer stays with the engine once
        its sends started (or ``held``)."""
        if s in self._sending:
            self._sending.remove(s)
        if s.exchange is not None:
            s.exchange.abandon()
        if s.exchange is not None or held:
            self._lost.append(s.flat)  # the engine may still read it
        if s.wire is not None:
            s.wire.abort()

    def drop_sends_to(self, ranks) -> None:
        """Give up the snapshots on their way to ``ranks`` (recorded dead): nobody will take
        them, and ``close()`` would otherwise drain them for the whole timeout."""
        for s in [s for s in self._sending if s.peer in ranks]:
            self._give_up(s)

    def progress(self) -> None:
        """Move the snapshots on their way along; forget those received or given up on. A
        receiver that died makes the engine fail its send (gloo: "Connection closed by
        peer"): that snapshot is given up, the error goes no further
        (tools/chaos_backup.py exercises this); on NCCL, which cannot cancel the send, it
        is a CommError."""
        for s in list(self._sending):
            self._guarded(s, self._progress)

    def _guarded(self, s: _Send, move) -> None:
        """``move(s)``; an engine error from a receiver that died gives ``s`` up instead of
        reaching the user, except on NCCL (the send cannot be cancelled: a CommError)."""
        try:
            move(s)
        except CommError:
            raise
        except RuntimeError as e:  # the engine's own error (CommError is one too)
            if self.comm.transport.stream_ordered:
                raise CommError(
                    f"commrt: rank {self.rank}: catch-up send to rank {s.peer} failed ({e})"
                ) from e
            self._give_up(s, held=True)  # even a send that failed to start may hold it

    def _progress(self, s: _Send) -> None:
        now = time.monotonic()
        if s.exchange is None:
            if self.store.check([Keys.posted(s.req)]):
                self._post(s)
            elif now - s.started > self.timeout:
                self._sending.remove(s)  # the late rank never came for it
            return
        if self._host_progress:
            s.exchange.sends_done()  # one MPI_Test: moves the message along
        if self.store.check([Keys.received(s.req)]):
            self._sending.remove(s)
            s.exchange.complete(now + self.timeout)
            if s.wire is not None:
                s.wire.transport.close()
        elif now - s.started > self.timeout:
            self._give_up(s)  # receiver gone: keep the buffer for the engine
            if self.comm.transport.stream_ordered:
                # the send holds the stream (it cannot be cancelled): nothing after it runs
                raise CommTimeoutError(
                    rank=self.rank,
                    peer=s.peer,
                    what="send (catch-up snapshot)",
                    timeout_s=self.timeout,
                    algorithm=str(self.algorithm),
                    step=s.step,
                )
