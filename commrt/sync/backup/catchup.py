"""Catch-up: a late rank asks for the latest state, an on-time rank sends it.

This module is the protocol and its late side (:class:`CatchUp`); the on-time
side is :class:`~commrt.sync.backup.serving.Server` (``serving``).

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
wait) runs whole on a thread, given up once the server is recorded dead, never in
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

import json
import time
from functools import partial

import torch

from commrt import settings
from commrt.errors import CommError, CommTimeoutError
from commrt.process.polling import poll
from commrt.schedule.p2p import Exchange, timeout_error
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.serving import Server, start_transfer
from commrt.sync.backup.waiter import MemberRecordedDead, WaiterSlot
from commrt.sync.snapshot import load_snapshot

CHECK_S = settings.Seconds(
    0.25,
    "how often a late rank waiting for a snapshot asks whether its server was recorded dead",
    "backup workers' catch-up",
    settings.POLLING,
)


class ServerDied(RuntimeError):
    """The rank serving this late rank's snapshot was recorded dead (the request goes out
    again, as after an engine error)."""


class ServerWaits:
    """A late rank's waits on its catch-up server (rank, incarnation): the blocking calls it
    runs end with :class:`ServerDied` once the server is recorded dead (so
    :meth:`CatchUp.receive` asks again, or on NCCL gives up): gloo does not always report a
    peer killed before its send began, and the wait would last the whole timeout
    (tools/chaos_backup.py exercises this). Where a wait that times out breaks the
    connection (gloo closes the pair, NCCL aborts the communicator) a call runs whole on a
    thread of ``waiters`` (:mod:`commrt.sync.backup.waiter`); elsewhere (MPI) waits are cut
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
        transport's ``sync``: that wait runs on the waiter too, or a server dead within a node,
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
        if self.whole and tr.traits.stream_ordered:
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


def _check_claimer(store, req: int) -> None:
    """Raise :class:`ServerDied` if the rank that claimed request ``req`` was recorded dead
    before answering it (nobody else would; tools/chaos_backup.py exercises this)."""
    if store.check([Keys.claim(req)]):
        server, inc = (int(x) for x in store.get(Keys.claim(req)).split())
        if store.check([Keys.dead(server, inc)]) and not store.check([Keys.response(req)]):
            raise ServerDied(f"rank {server} claimed catch-up request {req} and died")


class CatchUp:
    """Catch-up for one policy: this rank's requests and receiving their answers (the late
    side, here), and serving the others' (the on-time side,
    :class:`~commrt.sync.backup.serving.Server`, which :attr:`server` runs)."""

    def __init__(self, comm, store, params, algorithm, tracer=None, incarnation=0, pairs=None):
        #: the on-time side: answers the other ranks' requests
        self.server = Server(comm, store, params, algorithm, tracer, incarnation, pairs)
        self.comm, self.store, self.params = comm, store, params
        #: this rank's incarnation (>= 1: a replacement, reached only on pair groups)
        self.incarnation = incarnation
        self.algorithm = algorithm
        self.rank, self.p, self.timeout = comm.rank, comm.world_size, comm.timeout
        self._lost: list = []  # buffers of transfers whose peer vanished: the engine may hold them
        self._rbuf: torch.Tensor | None = None  # the late side's receive buffer
        self._next_claim_check = 0.0  # when the late side next looks at its request's claim
        self._waiters = WaiterSlot()  # runs a receive's gloo and NCCL waits (``ServerWaits``)

    def close(self) -> None:
        """End the thread a receive's waits ran on."""
        self._waiters.close()

    @property
    def held_bytes(self) -> int:
        """The bytes of the snapshots on their way, and of the receive buffer."""
        return self.server.held_bytes + (self._rbuf.numel() if self._rbuf is not None else 0)

    def record_state(self) -> None:
        """This rank's parameters or optimizer state were just written (by the caller's
        stream): the snapshots served from now on are ordered after that."""
        self.server.record_state()

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
        if req is not None and not self.server.claim(req):
            raise CommError(f"commrt: rank {self.rank}: catch-up request {req} was served")

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
                if self.comm.transport.traits.stream_ordered:  # the receive cannot be cancelled
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
        whole = pair is not None or self.comm.transport.traits.waits_break_on_timeout  # pair: gloo
        waits = ServerWaits(self.store, server, self._waiters, whole)
        # on the waiter too: NCCL's groupEnd waits for the server's own when the two never
        # connected, and a server that died would hold it for the whole timeout
        start = partial(start_transfer, self.server, req, server[0], self._rbuf, step, pair, False)
        exchange, wire = waits.run(_as_caller(self.comm.device, start))
        try:
            waits.take(exchange, deadline)
        finally:
            if wire is not None:
                wire.transport.close()
        self.store.set(Keys.received(req), "1")
        load_snapshot(self._rbuf, layout, self.params, optimizer)
        self.server.record_state()
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
