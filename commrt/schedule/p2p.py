"""Point-to-point exchanges outside schedules, and the errors every exchange raises.

:class:`Exchange` is one group of non-blocking sends and receives on a
communicator's transport: started under the communicator's lock (so no
other thread's group interleaves with it), ordered after and before the
caller's work on its buffers (``begin``/``end``, for stream-ordered
engines), waited on against a deadline, and failing with an error that
names this rank, the peer, the algorithm and the step. The executor's
schedule steps raise the same errors (:func:`timeout_error`,
:func:`engine_error`); the backup workers' catch-up and the gossip
shuffle exchange through :class:`Exchange`. Tags come from
:mod:`commrt.schedule.tags`.

Example::

    >>> ex = Exchange(comm, sends=[(buf, peer)], recvs=[], tag=tags.CATCHUP,
    ...               where=Where("backup catch-up", step=7))      # doctest: +SKIP
    >>> ex.complete(time.monotonic() + comm.timeout)             # doctest: +SKIP
"""

from __future__ import annotations

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
    that left (its farewell, :mod:`commrt.runtime.departures`) is named as such."""
    watch = transport.watch
    left = watch.explain() if watch is not None else None
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
        self.comm, self.where = comm, where
        self.sends, self.recvs = list(sends), list(recvs)
        self.transport: Transport = comm.transport if transport is None else transport
        self.holding = hold_lock
        self.done = False
        comm.lock.acquire()
        try:
            for t in self._buffers():
                self.transport.begin(t)
            self.pending = self.transport.exchange(self.sends, self.recvs, tag)
        except BaseException:
            comm.lock.release()
            raise
        if not hold_lock:
            comm.lock.release()

    def _buffers(self) -> list[torch.Tensor]:
        seen, out = set(), []
        for t, _ in self.sends + self.recvs:
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    def _fail(self, what: str, peer: int | None) -> None:
        raise timeout_error(self.transport.rank, what, peer, self.comm.timeout, self.where)

    def wait_recv(self, i: int, deadline: float) -> None:
        """Wait until receive ``i`` landed; raise the named timeout at ``deadline``."""
        if not self.pending.wait_recv(i, deadline):
            self._fail("recv", self.recvs[i][1])

    def wait_send(self, i: int, deadline: float) -> None:
        if not self.pending.wait_send(i, deadline):
            self._fail("send", self.sends[i][1])

    def sends_done(self) -> bool:
        """Poll once (an MPI_Test moves a message along); True when every send finished."""
        return all(self.pending.wait_send(i, 0.0) for i in range(len(self.sends)))

    def complete(self, deadline: float | None = None) -> None:
        """Wait for everything, raise the engine's errors, order later work after it."""
        if self.done:
            return
        if deadline is None:
            deadline = time.monotonic() + self.comm.timeout
        try:
            for i in range(len(self.recvs)):
                self.wait_recv(i, deadline)
            for i in range(len(self.sends)):
                self.wait_send(i, deadline)
            self.pending.finish()
            if not self.transport.sync(deadline):
                self._fail("device stream", None)
            for t in self._buffers():
                self.transport.end(t)
            self.done = True
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop holding the communicator's lock (the engine may still own the buffers)."""
        if self.holding:
            self.holding = False
            self.comm.lock.release()
