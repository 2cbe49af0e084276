"""Ranks that leave early: a closing or exiting rank says so, and waiting peers are told.

A rank that ran fewer steps than the others closes its communicator (or its
process exits, which closes nothing) while its peers still wait for it.
Without word from it they would wait until the timeout (MPI), or read a
closed connection as a crash (gloo). So every communicator keeps a
:class:`Departures`:

* it counts what this rank has begun: public collective calls (and
  barriers), and GradientSync steps (:meth:`Departures.begin_call`,
  :meth:`~Departures.begin_sync`, :meth:`~Departures.end_sync`, called by
  the communicator);
* at ``close()``, and at interpreter exit for a communicator still open,
  it announces a *farewell*: those counts and whether the rank closed or
  exited; a rank that ends the job after an error (:mod:`commrt.diagnosis.abort`)
  says that it *failed*, and which rank caused it where it knows (the stall
  verdict's root, or the peer its error names), so that a peer waiting on it
  follows the chain to that rank instead of blaming the one that left. Under MPI (no store) the farewell is a message on the reserved
  tag :data:`commrt.schedule.tags.FAREWELL`, for which every rank keeps a receive
  posted from every peer; on gloo it is a key in the rendezvous store
  (a gloo receive cannot be tested without blocking, but a closed peer
  breaks its connections at once, and the store then says why);
* a wait asks :meth:`Departures.check` now and then (the transport's
  bounded waits, every :data:`commrt.transports.base.CHECK_EVERY_S`), and
  an engine error asks :meth:`Departures.explain`. A farewell ends a wait
  only if the peer will never take part in what this rank waits in: the
  peer left after call (or step) N and this rank waits in a later one. A
  peer that left after finishing this very call is no reason to stop; a
  peer that failed will finish nothing more, so it ends a wait in the call
  it failed in too (:class:`~commrt.errors.PeerFailedError`).

The error is :class:`~commrt.errors.PeerClosedError`: "rank 0 closed its
communicator after GradientSync step 5 while rank 1 waits in GradientSync
step 6 (algorithm ring, step 0 of 2, bucket 0)". NCCL has neither a
testable receive nor a store here: its waits end at the timeout as before.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass

import torch

from commrt import settings
from commrt.errors import FIRST_NUMBER, PeerClosedError, PeerFailedError
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where

#: why a rank left
CLOSED, EXITED, FAILED = 1, 2, 3
HOW = {CLOSED: "closed its communicator", EXITED: "exited", FAILED: "failed"}
#: a farewell's cause when the leaving rank does not know which rank began the failure
UNKNOWN = -1
#: marks a farewell row ("farewel" in ASCII), so a stray message is never read as one
MAGIC = 0x6661726577656C
SEND_S = settings.Seconds(
    1.0,
    "how long a leaving rank waits for its farewell messages to leave (a peer may be gone)",
    "`Communicator.close`, a rank's exit",
    settings.STALLS,
)
#: what a farewell's exchange names
WHERE = Where("farewell")


@dataclass(frozen=True)
class Farewell:
    """What a leaving rank says: how many calls and GradientSync steps it began, why it
    left, and (``FAILED``) the rank its failure began at, or :data:`UNKNOWN`."""

    peer: int
    calls: int
    sync_steps: int
    how: int
    cause: int = UNKNOWN

    #: the length of a farewell row
    SIZE = 5

    def row(self) -> list[int]:
        return [MAGIC, self.calls, self.sync_steps, self.how, self.cause]

    @classmethod
    def from_row(cls, peer: int, row) -> "Farewell | None":
        v = [int(x) for x in row]
        if len(v) != cls.SIZE or v[0] != MAGIC or v[3] not in HOW:
            return None
        return cls(peer, v[1], v[2], v[3], v[4])


CHECK_POLL_S = settings.Seconds(
    0.02, "how often a wait tests for farewells", "every wait on a peer", settings.STALLS
)


class Departures:
    """One communicator's count of what it began, and the farewells its peers sent
    (see the module docs). Its methods are cheap; ``check`` may run on any thread."""

    def __init__(self, transport):
        self.rank, self.world_size = transport.rank, transport.world_size
        #: public collective calls (and barriers) begun
        self.calls = 0
        #: GradientSync steps finished, and whether one is in flight
        self.sync_steps = 0
        self.in_sync = False
        self.sync_waits_on_all = True
        #: peer -> its farewell, once heard
        self.left: dict[int, Farewell] = {}
        self.announced = False
        self.channel = _channel(transport) if transport.world_size > 1 else None
        #: time.monotonic() before which check() does not test the channel again
        self.quiet_until = 0.0

    # -- counting (the communicator calls these)
    def begin_call(self) -> None:
        self.calls += 1

    def begin_checked_call(self) -> None:
        """:meth:`begin_call`, then :meth:`check`: a collective's entry, in one call (an
        8-byte all-reduce takes a few microseconds, a call a tenth of one)."""
        self.calls += 1
        self.check()

    def begin_sync(self, waits_on_all: bool = True) -> None:
        """A GradientSync step begins; ``waits_on_all=False`` for families whose steps go on
        without ranks that left (backup workers): a farewell ends none of their waits."""
        self.in_sync = True
        self.sync_waits_on_all = waits_on_all

    def end_sync(self) -> None:
        if self.in_sync:
            self.sync_steps += 1
            self.in_sync = False

    # -- asking
    @property
    def waits_on_all(self) -> bool:
        """Whether this rank's waits now wait on every rank: outside a GradientSync step,
        or in one of a family that does (not backup workers)."""
        return not self.in_sync or self.sync_waits_on_all

    def check(self) -> None:
        """Raise :class:`PeerClosedError` if a peer that left will never take part in
        what this rank waits in (cheap: tests posted receives; nothing on gloo)."""
        if self.channel is None or self.announced:
            return
        now = time.monotonic()
        if now >= self.quiet_until:
            # at most every CHECK_POLL_S: a test of the posted receives is microseconds, a
            # large share of an 8-byte all-reduce; a wait that blocks still checks this often
            self.quiet_until = now + CHECK_POLL_S
            self.channel.poll(self.left, thorough=False)
        if not self.left:
            return
        err = self.blocking()
        if err is not None:
            raise err

    def explain(self) -> PeerClosedError | None:
        """After an engine error (a peer's connection closed): the farewell that explains
        it, if one does (reads the store on gloo)."""
        if self.channel is None:
            return None
        self.channel.poll(self.left, thorough=True)
        return self.blocking()

    def farewell_of(self, peer: int) -> Farewell | None:
        """``peer``'s farewell, where it left one (reads the store on gloo)."""
        if self.channel is not None and peer not in self.left:
            try:
                self.channel.poll(self.left, thorough=True)
            except Exception:  # the channel's peer or store is gone: what was heard stands
                pass
        return self.left.get(peer)

    def blocking(self) -> PeerClosedError | PeerFailedError | None:
        """The error for the first peer that left before what this rank waits in, or that
        failed (then it never finishes the call it was in either)."""
        if self.in_sync and not self.sync_waits_on_all:
            return None
        if self.in_sync:
            unit, mine = "GradientSync step", self.sync_steps + 1
        else:
            unit, mine = "collective call", self.calls
        # counts from 1 here; the errors name GradientSync steps from 0 (FIRST_NUMBER)
        shift = 1 - FIRST_NUMBER.get(unit, 1)
        for peer in sorted(self.left):
            f = self.left[peer]
            theirs = f.sync_steps if self.in_sync else f.calls
            if f.how == FAILED and mine >= theirs:
                cause = None if f.cause == UNKNOWN else f.cause  # its own rank: its own error
                return PeerFailedError(
                    rank=self.rank, peer=peer, cause=cause, unit=unit, waiting_in=mine - shift
                )
            if mine > theirs:
                return PeerClosedError(
                    rank=self.rank,
                    peer=peer,
                    how=HOW[f.how],
                    unit=unit,
                    peer_done=theirs - shift,
                    waiting_in=mine - shift,
                )
        return None

    # -- leaving
    def announce(self, how: int = CLOSED, cause: int | None = None) -> None:
        """Tell every peer (that has not left itself) that this rank leaves; ``cause``: for
        ``FAILED``, the rank the failure began at, where known. Idempotent."""
        if self.announced or self.channel is None:
            return
        self.announced = True
        cause = UNKNOWN if cause is None else cause
        farewell = Farewell(self.rank, self.calls, self.sync_steps, how, cause)
        try:
            self.channel.poll(self.left, thorough=False)
            self.channel.send(farewell, skip=set(self.left))
        except Exception:  # a peer or the store already gone: nobody left to tell
            pass

    def close(self) -> None:
        """Withdraw the posted receives (before the transport closes). Idempotent."""
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()


class _Messages:
    """Farewells as messages (MPI): a receive from every peer, posted at start."""

    def __init__(self, transport):
        self.transport = transport
        self.peers = [r for r in range(transport.world_size) if r != transport.rank]
        self.bufs = [torch.zeros(Farewell.SIZE, dtype=torch.int64) for _ in self.peers]
        recvs = list(zip(self.bufs, self.peers))
        # no communicator yet (it is being made): the exchange stands on the transport
        self.posted = Exchange(None, [], recvs, tags.FAREWELL, WHERE, transport=transport)
        self.open = list(range(len(self.peers)))
        self.lock = threading.Lock()  # one thread tests the requests at a time

    def poll(self, left: dict, thorough: bool) -> None:
        if not self.open or not self.lock.acquire(blocking=False):
            return
        try:
            for i in list(self.open):
                if self.posted.recv_landed(i):
                    self.open.remove(i)
                    f = Farewell.from_row(self.peers[i], self.bufs[i].tolist())
                    if f is not None:
                        left[f.peer] = f
        finally:
            self.lock.release()

    def send(self, farewell: Farewell, skip: set) -> None:
        peers = [r for r in self.peers if r not in skip]
        row = torch.tensor(farewell.row(), dtype=torch.int64)
        sends = [(row, r) for r in peers]
        ex = Exchange(None, sends, [], tags.FAREWELL, WHERE, transport=self.transport)
        deadline = time.monotonic() + SEND_S
        if not all(ex.send_landed(i, deadline) for i in range(len(peers))):
            ex.cancel()

    def close(self) -> None:
        with self.lock:
            self.posted.cancel()
            self.open = []


class _Stored:
    """Farewells as keys in the rendezvous store (gloo), one generation per communicator:
    each rank counts its own communicators on that store, as every rank makes the same."""

    def __init__(self, transport):
        self.store, self.rank = transport.store, transport.rank
        self.peers = [r for r in range(transport.world_size) if r != transport.rank]
        gen = self.store.add(f"farewell_generation/{self.rank}", 1)
        self.prefix = f"farewell/{gen}/"

    def poll(self, left: dict, thorough: bool) -> None:
        if not thorough:
            return  # a store round trip per check would cost every wait; gloo's fail fast
        try:
            for r in self.peers:
                key = self.prefix + str(r)
                if r in left or not self.store.check([key]):
                    continue
                text = bytes(self.store.get(key)).decode()
                f = Farewell.from_row(r, text.split(","))
                if f is not None:
                    left[r] = f
        except RuntimeError:  # the store's host is gone (rank 0 hosted it and left)
            return

    def send(self, farewell: Farewell, skip: set) -> None:
        self.store.set(self.prefix + str(self.rank), ",".join(map(str, farewell.row())))

    def close(self) -> None:
        pass


def _channel(transport):
    if transport.traits.pollable:
        return _Messages(transport)
    if transport.store is not None:
        return _Stored(transport)
    return None  # NCCL, test transports: waits end at the timeout


def track(comm) -> None:
    """Announce ``comm``'s farewell if it is dropped, or still open at interpreter exit,
    without ``close()`` (a script that just returns): ``weakref.finalize`` runs at either.
    The transport is released right after, so that gloo peers see the connection close
    now rather than when the interpreter is finally gone."""
    weakref.finalize(comm, _leave, comm.departures, comm.transport)


def _leave(departures: Departures, transport) -> None:
    if departures.channel is None:  # closed already, or nobody to tell (one rank, NCCL)
        return
    try:
        departures.announce(EXITED)
        departures.close()
        transport.close()
    except Exception:  # exiting anyway
        pass
