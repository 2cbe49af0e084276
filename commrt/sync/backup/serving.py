"""Catch-up, the on-time side: claiming a late rank's request and sending it a snapshot.

:class:`Server` is the half of :class:`~commrt.sync.backup.catchup.CatchUp` an on-time
rank runs (the protocol, its memory bound and NCCL's rules are in
:mod:`commrt.sync.backup.catchup`): it reads the requests, claims those it can answer,
packs its state, publishes the response and moves each snapshot along until its receiver
confirms it, gives up on receivers that died. The pieces both sides use to move a
snapshot (:func:`start_transfer`, :meth:`Server.claim`) live here,
below the late side that imports them.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

import torch

from commrt.errors import CommError, CommTimeoutError
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.wire import Wire
from commrt.sync.snapshot import pack_snapshot, pieces


def span(tracer, name: str, **args):
    """``tracer``'s span, or nothing when there is no tracer."""
    return tracer.span(name, **args) if tracer is not None else contextlib.nullcontext()


def _pair_wire(where, store, req: int, peer: tuple[int, int], rank: int, timeout) -> Wire:
    """The two-rank group request ``req`` travels on (one end rejoined; ``where``: control
    store and key space); making it ends once ``peer`` (rank, incarnation) is recorded dead."""
    dead = Keys.dead(*peer)
    members = tuple(sorted((peer[0], rank)))
    return Wire(*where, Keys.pair(req), members, rank, timeout, (), lambda: store.check([dead]))


def start_transfer(c: "Server", req: int, peer: int, flat, step: int, pair: int | None, send: bool):
    """Start moving ``flat`` to (``send``) or from ``peer`` for request ``req`` (either side
    of the catch-up; ``c``: this rank's server, for the communicator, store and rank); return
    the exchange and, with ``pair`` (the peer's incarnation), the two-rank group it runs on."""
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


class Server:
    """The on-time side of catch-up for one policy (module docs): serving requests, within
    the memory bound of ``max(1, b)`` snapshots on their way at once."""

    def __init__(self, comm, store, params, algorithm, tracer=None, incarnation=0, pairs=None):
        self.comm, self.store, self.params = comm, store, params
        #: this rank's incarnation (>= 1: a replacement, reached only on pair groups)
        self.incarnation = incarnation
        self.pairs = pairs  # (control store, key space): where pair groups meet
        self.algorithm, self.tracer = algorithm, tracer
        self.rank, self.p, self.timeout = comm.rank, comm.world_size, comm.timeout
        self.served = 0  # snapshots this rank has served
        # an engine that moves a message only inside its calls: a server tests its sends
        self._host_progress = comm.transport.traits.progress_in_calls
        self._seen = 0  # requests read from the store so far
        self._open: dict[int, tuple[int, int, int]] = {}  # unanswered: req -> (rank, step, inc)
        self._sending: list[_Send] = []
        self._lost: list = []  # buffers of transfers whose peer vanished: the engine may hold them
        self._state_event = None  # when this rank's state was last written

    @property
    def busy(self) -> bool:
        """Snapshots are still on their way."""
        return bool(self._sending)

    @property
    def held_bytes(self) -> int:
        """The bytes of the snapshots on their way."""
        return sum(s.flat.numel() for s in self._sending)

    def record_state(self) -> None:
        """This rank's parameters or optimizer state were just written (by the caller's stream)."""
        # a snapshot may be copied on the progress thread, on another stream: order it after the
        # optimizer step (and the loads) that produced this state
        if self.comm.device.type == "cuda":
            self._state_event = torch.cuda.Event()
            self._state_event.record(torch.cuda.current_stream(self.comm.device))

    def claim(self, req: int) -> bool:
        """Take request ``req`` for this rank (once, whoever asks first); the claim names
        its rank, so a late rank can tell when its claimer died before answering."""
        mine = f"{self.rank} {self.incarnation}"
        return self.store.compare_set(Keys.claim(req), "", mine).decode() == mine

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
            if not self.claim(i):
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
        s.exchange, s.wire = start_transfer(self, s.req, s.peer, s.flat, s.step, s.pair, True)

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
            if self.comm.transport.traits.stream_ordered:
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
            if self.comm.transport.traits.stream_ordered:
                # the send holds the stream (it cannot be cancelled): nothing after it runs
                raise CommTimeoutError(
                    rank=self.rank,
                    peer=s.peer,
                    what="send (catch-up snapshot)",
                    timeout_s=self.timeout,
                    algorithm=str(self.algorithm),
                    step=s.step,
                )
