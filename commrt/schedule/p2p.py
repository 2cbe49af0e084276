"""Point-to-point exchanges outside schedules, and the errors every exchange raises.

:class:`Exchange` is one group of non-blocking sends and receives on a
communicator's transport: started under the communicator's lock (so no
other thread's group interleaves with it), ordered after and before the
caller's work on its buffers (``begin``/``end``, for stream-ordered
engines), waited on against a deadline, and failing with an error that
names this rank, the peer, the algorithm and the step. The executor's
schedule steps raise the same errors (:func:`timeout_error`,
:func:`engine_error`). Every message outside a schedule travels in an
:class:`Exchange`: the backup workers' catch-up, the gossip shuffle,
gossip's messages with a deadline and a replacement's snapshot
(:mod:`commrt.sync.gossip`), and the farewells of ranks that leave
(:mod:`commrt.diagnosis.departures`). Tags come from
:mod:`commrt.schedule.tags`.

Example::

    >>> ex = Exchange(comm, sends=[(buf, peer)], recvs=[], tag=tags.CATCHUP,
    ...               where=Where("backup catch-up", step=7))      # doctest: +SKIP
    >>> ex.complete(time.monotonic() + comm.timeout)             # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from commrt.errors import CommError, CommTimeoutError
from commrt.transports.base import Pair, Transport


@dataclass(frozen=True)
class Where:
    """What an error about an exchange names besides the ranks."""

    algorithm: str
    step: int | None = None
    num_steps: int | None = None
    bucket: int | None = None

    def describe(self) -> str:
        """The parts known, as in "algorithm ring, step 2 of 6, bucket 1"."""
        parts = [f"algorithm {self.algorithm}"]
        if self.step is not None:
            parts.append(f"step {self.step}" + (f" of {self.num_steps}" if self.num_steps else ""))
        if self.bucket is not None:
            parts.append(f"bucket {self.bucket}")
        return ", ".join(parts)


def timeout_error(
    rank: int, what: str, peer: int | None, timeout_s: float, where: Where
) -> CommTimeoutError:
    return CommTimeoutError(
        rank=rank,
        peer=peer,
        what=what,
        timeout_s=timeout_s,
        algorithm=where.algorithm,
        step=where.step,
        num_steps=where.num_steps,
        bucket=where.bucket,
    )


def engine_error(
    transport: Transport, err: Exception, peers: Sequence[int], where: Where
) -> CommError:
    """An engine's raw error (a peer's connection closed, ...) in commrt's terms: a peer
    that left (its farewell, :mod:`commrt.diagnosis.departures`) is named as such."""
    departures = transport.departures
    left = departures.explain() if departures is not None else None
    if left is not None:
        return left.at(where.describe())
    error = CommError(
        f"commrt: rank {transport.rank}: {transport.name} failed in {where.describe()} "
        f"(peers {sorted(set(peers))}){diagnose(str(err))}: {err}"
    )
    error.where, error.peers = where.describe(), sorted(set(peers))  # (CommError declares them)
    return error


def diagnose(engine_message: str) -> str:
    """What an engine's raw error most likely means, in commrt's terms."""
    text = engine_message.lower()
    if "truncat" in text or "preamble" in text:
        return (
            " — a message was larger than the receive posted for it: the ranks called "
            "collectives of different sizes; run with COMMRT_DEBUG=1 to have every rank "
            "name the mismatch"
        )
    if "connection reset" in text or "connection closed" in text or "broken pipe" in text:
        return " — a peer closed its connection: it probably died; look at its output"
    if "process" in text and "is gone" in text:
        return " — a peer's process ended without a farewell: it died; look at its output"
    return ""


class Exchange:
    """One group of sends and receives, started at construction.

    ``hold_lock``: keep the communicator's lock until :meth:`complete` (or
    :meth:`abandon`), for engines on which no other group may be enqueued
    meanwhile (NCCL); otherwise the lock is held only while starting.
    ``transport``: run on this transport instead of the communicator's (a group
    a caller made for some of its ranks; peers are then ranks of that group).
    ``comm=None`` (with ``transport``): a transport with no communicator around
    it, yet or any more (a communicator's farewells are posted before it exists
    and sent after it is gone): nothing is locked, and a timeout's error names
    the time from the start to the deadline.

    Waits come in two kinds: :meth:`wait_recv`, :meth:`wait_send` and
    :meth:`complete` raise the named timeout; :meth:`recv_landed` and
    :meth:`send_landed` answer True or False, for callers that never wait past
    a deadline of their own (gossip's messages, a farewell). Both pass an
    engine's raw error (a peer's connection broke) through.
    """

    def __init__(
        self,
        comm,
        sends: Sequence[Pair],
        recvs: Sequence[Pair],
        tag: int,
        where: Where,
        *,
        hold_lock: bool = False,
        transport: Transport | None = None,
    ):
        if comm is None and transport is None:
            raise ValueError("commrt: an Exchange without a communicator needs a transport")
        self.comm, self.where = comm, where
        self.sends, self.recvs = list(sends), list(recvs)
        self.transport: Transport = comm.transport if transport is None else transport
        # without a communicator there is nobody to exclude: a lock of its own keeps one path
        self.lock = comm.lock if comm is not None else threading.Lock()
        self.started = time.monotonic()
        self.holding = hold_lock
        self.done = False
        self.lock.acquire()
        try:
            for t in self._buffers():
                self.transport.begin(t)
            self.pending = self.transport.exchange(self.sends, self.recvs, tag)
        except BaseException:
            self.lock.release()
            raise
        if not hold_lock:
            self.lock.release()

    def _buffers(self) -> list[torch.Tensor]:
        seen, out = set(), []
        for t, _ in self.sends + self.recvs:
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    def _fail(self, what: str, peer: int | None, deadline: float) -> None:
        timeout = self.comm.timeout if self.comm is not None else deadline - self.started
        raise timeout_error(self.transport.rank, what, peer, timeout, self.where)

    def recv_landed(self, i: int, deadline: float = 0.0) -> bool:
        """Wait until receive ``i`` landed or ``deadline`` passed (0.0: poll once);
        True when it landed."""
        return self.pending.wait_recv(i, deadline)

    def send_landed(self, i: int, deadline: float = 0.0) -> bool:
        """Wait until send ``i`` left or ``deadline`` passed (0.0: poll once); True when
        it left."""
        return self.pending.wait_send(i, deadline)

    def wait_recv(self, i: int, deadline: float) -> None:
        """Wait until receive ``i`` landed; raise the named timeout at ``deadline``."""
        if not self.recv_landed(i, deadline):
            self._fail("recv", self.recvs[i][1], deadline)

    def wait_send(self, i: int, deadline: float) -> None:
        """Wait until send ``i`` left; raise the named timeout at ``deadline``."""
        if not self.send_landed(i, deadline):
            self._fail("send", self.sends[i][1], deadline)

    def sends_done(self) -> bool:
        """Poll once (an MPI_Test moves a message along); True when every send finished."""
        return all(self.send_landed(i) for i in range(len(self.sends)))

    def complete(self, deadline: float | None = None) -> None:
        """Wait for everything, raise the engine's errors, order later work after it."""
        if self.done:
            return
        if deadline is None:
            if self.comm is None:
                raise ValueError("commrt: an Exchange without a communicator needs a deadline")
            deadline = time.monotonic() + self.comm.timeout
        try:
            for i in range(len(self.recvs)):
                self.wait_recv(i, deadline)
            for i in range(len(self.sends)):
                self.wait_send(i, deadline)
            self.pending.finish()
            if not self.transport.sync(deadline):
                self._fail("device stream", None, deadline)
            for t in self._buffers():
                self.transport.end(t)
            self.done = True
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop holding the communicator's lock (the engine may still own the buffers)."""
        if self.holding:
            self.holding = False
            self.lock.release()

    def cancel(self) -> None:
        """Withdraw what has not finished (a receive posted for a message that may never
        come, a send to a peer that is gone), so the transport can close."""
        self.abandon()
        self.pending.cancel()
