"""Gossip's messages with a deadline: posted at once, noticed when they land, never waited on.

gloo's send and receive works cannot be polled (``is_completed()`` stays
False after the bytes landed) and a wait that times out closes the
connection, so a rank cannot look at a message and go on. A
:class:`Postbox` therefore gives every (peer, direction) one waiter thread
that waits, in posting order, on that peer's works with the
communicator's full timeout; messages between one pair of ranks complete
in the order they were sent (one connection each), so waiting in order
costs nothing. The thread marks each :class:`Letter` arrived (or failed,
when the peer's connection broke: it died) and wakes whoever waits on the
postbox's condition. The caller waits for a letter until *its* deadline and
goes on whatever the answer.

**Routes.** A replacement of a dead rank (:mod:`commrt.sync.gossip.rejoin`)
has no connection on the job's gloo group: the messages between it and any
other rank travel on a two-rank group made for that pair. :meth:`Postbox.route`
sends one peer's letters over such a group (by its number there); the
others keep the communicator's transport. A letter that fails on a route
the peer no longer travels (the dead incarnation's, still in flight when
the replacement was routed) breaks nothing: the peer stays whole. Each
(peer, direction, transport) has its own waiter, so a letter on the new
route never queues behind the old incarnation's.

Each posting is one :class:`~commrt.schedule.p2p.Exchange`, started under
the communicator's lock. Where a wait can be a mere test
(``transport.traits.testable``: MPI, shm, ``cuda_ipc``) the waiter polls under the
communicator's lock instead, a test every half millisecond. On ``cuda_ipc`` a
test issues a receive's device copy only once the sender's host posted the
piece, so a late message holds no stream: it is issued when it comes.
NCCL's posted receive holds its stream until its data comes and cannot be
withdrawn: the policy refuses it.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch

from commrt import settings
from commrt.process.threads import background_thread, idle_wait
from commrt.schedule.p2p import Exchange, Where

#: a letter still travelling
WAITING = "waiting"
#: a letter whose bytes landed (a receive) or whose buffer is free again (a send)
ARRIVED = "arrived"
#: a letter whose peer's connection broke, or that timed out: it will never land
FAILED = "failed"

POLL_S = settings.Seconds(
    5e-4,
    "the time between two polls of an MPI transport for gossip's messages",
    "gossip with a deadline",
    settings.POLLING,
)
#: what an error about a letter's exchange names
WHERE = Where("gossip with a deadline")


class Letter:
    """One message of gossip step ``step``, bucket ``bucket``, to or from ``peer``."""

    __slots__ = ("step", "bucket", "peer", "buf", "state", "posted_at", "landed_at", "error")

    def __init__(self, step: int, bucket: int, peer: int, buf: torch.Tensor):
        self.step, self.bucket, self.peer, self.buf = step, bucket, peer, buf
        self.state = WAITING
        self.posted_at = time.monotonic()
        self.landed_at: float | None = None
        self.error: BaseException | None = None

    @property
    def latency(self) -> float | None:
        """Seconds from posting to landing (None while travelling or failed)."""
        return None if self.landed_at is None else self.landed_at - self.posted_at


class Postbox:
    """Non-blocking sends and receives, each waited on by its peer's waiter thread."""

    def __init__(self, comm, timeout_s: float):
        self.comm, self.timeout_s = comm, timeout_s
        self.transport = comm.transport
        #: guards every letter's state and the queues; notified when a letter resolves
        self.cv = threading.Condition()
        #: peers whose connection broke (dead, as far as this rank can tell)
        self.broken: set[int] = set()
        self._queues: dict[tuple[int, str], deque] = {}
        #: peer -> (transport, the peer's number on it) where not the communicator's
        self._routes: dict[int, tuple[object, int]] = {}
        self._threads: list[threading.Thread] = []
        self._closing = False

    def broken_now(self) -> set[int]:
        """A copy of :attr:`broken` (the waiter threads add to it)."""
        with self.cv:
            return set(self.broken)

    def route(self, peer: int, transport, at: int) -> None:
        """From now on, ``peer``'s letters travel on ``transport``, where it is rank ``at``;
        its connection counts as whole again (a replacement, alive)."""
        with self.cv:
            self._routes[peer] = (transport, at)
            self.broken.discard(peer)

    def post(self, tag: int, send: Letter | None, recv: Letter | None) -> None:
        """Start ``send`` and ``recv`` (either may be None) under ``tag``: one group where
        both travel on one transport."""
        way = {
            x.peer: self._routes.get(x.peer, (self.transport, x.peer))
            for x in (send, recv)
            if x is not None
        }
        if send is not None and recv is not None and way[send.peer][0] is not way[recv.peer][0]:
            self._post(tag, send, None, way)
            self._post(tag, None, recv, way)
        else:
            self._post(tag, send, recv, way)

    def _post(self, tag: int, send: Letter | None, recv: Letter | None, way: dict) -> None:
        transport = way[(send or recv).peer][0]
        sends = [(send.buf, way[send.peer][1])] if send is not None else []
        recvs = [(recv.buf, way[recv.peer][1])] if recv is not None else []
        try:
            ex = Exchange(self.comm, sends, recvs, tag, WHERE, transport=transport)
        except Exception as e:  # a peer's connection already broke: neither will land
            for letter in (send, recv):
                if letter is not None:
                    self._resolve(letter, False, e, transport)
            return
        if recv is not None:
            self._enqueue(recv.peer, "recv", transport, (ex, 0, recv))
        if send is not None:
            self._enqueue(send.peer, "send", transport, (ex, 0, send))

    def wait(self, letter: Letter, deadline: float) -> bool:
        """Wait until ``letter`` resolved or ``time.monotonic()`` reaches ``deadline``;
        True when it resolved."""
        with self.cv:
            while letter.state == WAITING:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    def wait_all(self, letters, deadline: float) -> None:
        """Wait until every letter resolved or the deadline passed."""
        for letter in letters:
            self.wait(letter, deadline)

    def close(self) -> None:
        """Stop the waiter threads once their current wait ends (one still waiting on a
        letter that will never land ends at the timeout: the program's exit waits for it,
        :func:`~commrt.process.threads.background_thread`)."""
        with self.cv:
            self._closing = True
            self.cv.notify_all()

    # -- the waiter threads

    def _enqueue(self, peer: int, kind: str, transport, item) -> None:
        with self.cv:
            key = (peer, kind, id(transport))
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = deque()
                thread = background_thread(
                    lambda: self._waiter(queue, kind, transport), f"commrt-gossip-{kind}-{peer}"
                )
                self._threads.append(thread)
                thread.start()
            queue.append(item)
            self.cv.notify_all()

    def _waiter(self, queue: deque, kind: str, transport) -> None:
        while True:
            with self.cv:
                while not queue and not self._closing:
                    if not idle_wait(self.cv):
                        return  # never closed: do not hold the exit
                if not queue:
                    return
                ex, i, letter = queue[0]
            ok, error = self._wait_one(ex, i, kind)
            with self.cv:
                queue.popleft()
            self._resolve(letter, ok, error, transport)

    def _wait_one(self, ex: Exchange, i: int, kind: str) -> tuple[bool, BaseException | None]:
        deadline = time.monotonic() + self.timeout_s
        wait = ex.recv_landed if kind == "recv" else ex.send_landed
        try:
            if not ex.transport.traits.testable:
                return wait(i, deadline), None
            while True:
                with self.comm.lock:
                    if wait(i, 0.0):
                        return True, None
                if time.monotonic() > deadline or self._closing:
                    return False, None
                time.sleep(POLL_S)
        except Exception as e:  # the peer's connection broke (it died): never lands
            return False, e

    def _resolve(self, letter: Letter, ok: bool, error: BaseException | None, transport) -> None:
        with self.cv:
            if ok:
                letter.state, letter.landed_at = ARRIVED, time.monotonic()
            else:
                letter.state, letter.error = FAILED, error
                now = self._routes.get(letter.peer, (self.transport,))[0]
                if error is not None and transport is now:  # not a dead incarnation's route
                    self.broken.add(letter.peer)
            self.cv.notify_all()
