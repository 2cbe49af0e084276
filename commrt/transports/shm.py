"""Shared-memory transport: ranks on one host exchange bytes through ``/dev/shm`` rings.

gloo moves every message through a TCP socket and a thread of its own, even
between two processes on the same machine: an 11 kB send and receive costs
tens of microseconds of system calls on each side. Here every ordered pair
of ranks has a ring buffer in a shared-memory file, and a message is one
copy into the ring and one copy out, with no system call in between.

Layout. Rank ``r`` owns one file, ``/dev/shm/commrt-<token>-<r>``, holding
one *inbound* ring per peer. A ring is a 128-byte head (the writer's
``tail`` counter at byte 0, the reader's ``head`` counter at byte 64, on
separate cache lines) and ``ring_bytes`` of data. Counters only grow; a
position is ``counter % ring_bytes``. A message is a 16-byte header (tag,
length) and its bytes, padded to 16, so a header never wraps. The writer
copies bytes in and then advances ``tail``; the reader copies out and then
advances ``head``. x86-64 keeps stores in order (and loads in order), so a
reader that sees ``tail`` move also sees the bytes before it; other
architectures are refused by name, since Python has no memory fence.

Progress. Nothing runs in the background: every call into the transport
(an exchange, a wait, a test) pushes whatever fits of the queued sends and
pulls whatever arrived, under one lock. A message longer than its ring
therefore flows as the two ranks wait on each other, which they do in every
schedule. A wait's poll first reads the counters without the lock, and does
that work only when something can move. A message that arrives before its
receive is posted is kept aside (MPI's "unexpected" queue) and matched when
the receive comes, by (peer, tag), first in first out, as MPI and gloo
match.

Failure. A process that dies leaves no error behind in shared memory, so a
wait longer than a few milliseconds asks, every
:data:`commrt.transports.base.CHECK_EVERY_S`, whether the peer it waits on
still runs (its pid, not a zombie, with the start time it published). A
closing rank's farewell travels as a message, like MPI's
(:mod:`commrt.diagnosis.departures`). The files are unlinked as soon as every
rank has mapped them, so a crash leaves nothing in ``/dev/shm``.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Sequence

import numpy as np
import torch

from commrt.transports import traits as engine
from commrt.transports.base import (
    Pair,
    Pending,
    Prepared,
    Transport,
    exchange_barrier,
    ordered_sum,
    poll_until,
)
from commrt.transports.processes import start_time
from commrt.transports.shm_rings import (  # noqa: F401  (the ring files' constants, here too)
    MIN_RING_BYTES,
    ORDERED_ARCHES,
    RING_BYTES,
    RING_HEAD,
    SHM_DIR,
    Inbound,
    Op,
    Ring,
    Truncated,
)

#: tags the transport keeps for itself (the job's tags are never negative)
BARRIER_TAG, NATIVE_TAG = -1, -2


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    """The tensor's memory as a flat uint8 array (no copy): any dtype, bf16 and bool included."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("the shm transport moves contiguous CPU tensors only")
    return t.reshape(-1).view(torch.uint8).numpy()


def _operations(sends: Sequence[Pair], recvs: Sequence[Pair], tag: int, adds: tuple = ()):
    """The send and receive operations of an exchange, not started: (sends, receives);
    receive ``i`` with ``adds[i]`` adds into its tensor."""
    rops = [
        Op(_bytes_of(t), peer, tag, t.reshape(-1).numpy() if i < len(adds) and adds[i] else None)
        for i, (t, peer) in enumerate(recvs)
    ]
    return [Op(_bytes_of(t), peer, tag) for t, peer in sends], rops


class _ShmPending(Pending):
    __slots__ = ("transport", "sends", "recvs", "spin_s")

    def __init__(self, transport: "ShmTransport", sends, recvs, spin_s: float = 0.0):
        self.transport, self.sends, self.recvs, self.spin_s = transport, sends, recvs, spin_s

    # most waits find their operation done by the exchange that started it: one test
    def wait_recv(self, i: int, deadline: float) -> bool:
        op = self.recvs[i]
        return op.done or self.transport.wait(op, deadline, self.spin_s)

    def wait_send(self, i: int, deadline: float) -> bool:
        op = self.sends[i]
        return op.done or self.transport.wait(op, deadline, self.spin_s)

    def cancel(self) -> None:
        self.transport.withdraw(self.recvs)


class _AddingPrepared(Prepared):
    """A step whose receives marked in ``adds`` add into their tensors (none: a plain
    step, whose waits spin for ``spin_s`` as the executor asks). Its operations (the
    tensors' bytes as numpy views) and their Pending are made once and started again and
    again; a start whose last operations did not all finish (a wait that timed out) makes
    new ones."""

    __slots__ = ("adds", "ops", "pending")

    def __init__(self, transport, sends, recvs, tag, adds):
        super().__init__(transport, sends, recvs, tag)
        self.adds = adds
        self._make()

    def _make(self) -> None:
        sops, rops = _operations(self.sends, self.recvs, self.tag, self.adds)
        self.ops, self.pending = sops + rops, _ShmPending(self.transport, sops, rops)

    def start(self, spin_s: float = 0.0) -> Pending:
        for op in self.ops:
            if not op.done:
                self._make()
                break
        else:
            for op in self.ops:
                op.off, op.done = -1, False
        pending = self.pending
        pending.spin_s = spin_s
        self.transport.post(pending.sends, pending.recvs)
        return pending


class ShmTransport(Transport):
    """Point-to-point through shared-memory rings between ranks of one host. Made by
    :func:`connect`, which every rank calls together."""

    name = "shm"
    traits = engine.SHM
    #: the store the ranks met through (the stall watch meets there too); set by connect()
    store = None

    def __init__(self, rank: int, world_size: int, maps: dict, ring_bytes: int, pids: dict):
        super().__init__(rank, world_size, torch.device("cpu"))
        self.ring_bytes = ring_bytes
        self._maps = maps  # rank -> its file's mmap (this rank's own included)
        self._pids = pids  # peer -> (pid, start time)
        self._lock = threading.RLock()
        self._out: dict[int, Ring] = {}
        self._tail: dict[int, int] = {}
        self._queued: dict[int, deque] = {}
        self._in: dict[int, Inbound] = {}
        for peer in range(world_size):
            if peer == rank:
                continue
            out = Ring(maps[peer], _ring_offset(rank, peer, ring_bytes), ring_bytes)
            self._out[peer], self._tail[peer] = out, int(out.tail[0])
            self._queued[peer] = deque()
            ring = Ring(maps[rank], _ring_offset(peer, rank, ring_bytes), ring_bytes)
            self._in[peer] = Inbound(ring)
        #: each peer's ring head as the last push saw it (see :meth:`_quiet`)
        self._head_seen = dict.fromkeys(self._out, -1)
        #: what :meth:`_quiet` reads without the lock; fixed, so close() cannot change it
        self._inbounds = tuple(self._in.values())
        self._tails = tuple((inbound.ring.tail, inbound) for inbound in self._inbounds)
        self._outbound = tuple((p, self._queued[p], self._out[p]) for p in self._out)
        self._broken: str | None = None

    # -- the interface
    def exchange(
        self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int, adds: tuple = ()
    ) -> Pending:
        """Start ``sends`` and ``recvs``; receive ``i`` with ``adds[i]`` adds into its
        tensor as the bytes arrive (:meth:`prepare_adding`)."""
        sops, rops = _operations(sends, recvs, tag, adds)
        self.post(sops, rops)
        return _ShmPending(self, sops, rops)

    def post(self, sops: list, rops: list) -> None:
        """Queue ``sops`` and post ``rops``, pushing the sends first (the peer waits for
        them), and move what can move."""
        self._lock.acquire()  # not ``with``: its __enter__/__exit__ double a lock's cost
        try:
            self._raise_if_broken()
            for op in sops:
                self._queued[op.peer].append(op)
            for peer, queue, _ in self._outbound:
                if queue:
                    self._push(peer, queue)
            for op in rops:
                self._in[op.peer].post(op)
            for inbound in self._inbounds:
                inbound.pull()
        except Truncated as e:
            self._broken = str(e)
            self._raise_if_broken()
        finally:
            self._lock.release()

    def prepare(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Prepared:
        return _AddingPrepared(self, sends, recvs, tag, ())

    def prepare_adding(
        self, sends: Sequence[Pair], recvs: Sequence[Pair], adds: tuple, tag: int
    ) -> Prepared:
        return _AddingPrepared(self, sends, recvs, tag, adds)

    def barrier(self, timeout: float) -> bool:
        return exchange_barrier(self, timeout, BARRIER_TAG)

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """The oracle: a direct exchange summed in rank order
        (:func:`~commrt.transports.base.ordered_sum`)."""
        ordered_sum(self, tensor, op, NATIVE_TAG)

    def close(self) -> None:
        with self._lock:
            self._broken = self._broken or "the transport is closed"
            self._out.clear()
            self._in.clear()
            maps, self._maps = self._maps, {}
        for mm in maps.values():
            try:
                mm.close()
            except BufferError:  # a numpy view still exported: the mapping goes with it
                pass

    # -- waiting
    def wait(self, op: Op, deadline: float, spin_s: float = 0.0) -> bool:
        """Progress everything until ``op`` is done; False at the deadline. Every
        CHECK_EVERY_S of a long wait, a dead peer (or a farewell) ends it with an error.
        Called for an ``op`` not done yet (:class:`_ShmPending` tests that first)."""
        if not self._quiet():  # what already arrived, before a wait is set up at all
            with self._lock:
                moved = [self._progress()]
            if op.done:
                return True
        else:
            moved = [False]

        def done() -> bool:
            if op.done or self._quiet():
                return op.done
            with self._lock:
                moved[0] = self._progress() or moved[0]
            return op.done

        def moving() -> bool:
            was, moved[0] = moved[0], False
            return was

        def check() -> None:
            if self.departures is not None:
                self.departures.check()
            if not self._peer_alive(op.peer):
                if done():  # its last bytes landed before it went
                    return
                raise RuntimeError(
                    f"shm: rank {op.peer}'s process (pid {self._pids[op.peer][0]}) is gone "
                    f"while rank {self.rank} waits on it"
                )

        return poll_until(done, deadline, spin_s, check, moving)

    def withdraw(self, recvs: Sequence[Op]) -> None:
        """Forget receives that are still posted (a cancelled exchange)."""
        with self._lock:
            for op in recvs:
                inbound = self._in.get(op.peer)
                if op.done or inbound is None or inbound.withdraw(op):
                    continue
                self._broken = "a receive was withdrawn while its data was added in"

    def _quiet(self) -> bool:
        """Whether a progress would find nothing to move: no inbound ring holds bytes not yet
        read, and every peer with sends queued has the same ring head as when its last push
        filled the ring. Read without the lock (plain loads of counters), so that the polls of
        a long wait, most of which find nothing, cost a few loads instead of a progress."""
        if self._broken is not None:
            return False
        for tail, inbound in self._tails:
            if tail[0] != inbound.head:
                return False
        for peer, queue, ring in self._outbound:
            if queue and ring.head[0] != self._head_seen[peer]:
                return False
        return True

    def _peer_alive(self, peer: int) -> bool:
        pid, started = self._pids[peer]
        return start_time(pid) == started

    # -- progress (under the lock)
    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"shm: rank {self.rank}: {self._broken}")

    def _progress(self) -> bool:
        """Push and pull what fits; whether anything moved."""
        self._raise_if_broken()
        moved = False
        for peer, queue, _ in self._outbound:
            if queue:
                moved = self._push(peer, queue) or moved
        try:
            for inbound in self._inbounds:
                moved = inbound.pull() or moved
        except Truncated as e:
            self._broken = str(e)
            self._raise_if_broken()
        return moved

    def _push(self, peer: int, queue: deque) -> bool:
        ring, tail = self._out[peer], self._tail[peer]
        was, head, size = tail, ring.head[0], ring.size
        self._head_seen[peer] = head
        space = size - (tail - head)
        while queue and space > 0:
            op = queue[0]
            n = op.n
            if op.off < 0:
                if space < 16:
                    break
                at = (tail % size) >> 3
                ring.words[at] = op.tag
                ring.words[at + 1] = n
                tail, space, op.off = tail + 16, space - 16, 0
                at = tail % size
                if space >= op.end and at + n <= size:  # the common case: all of it at once
                    ring.bytes[at : at + n] = op.mem
                    tail, space = tail + op.end, space - op.end
                    op.done = True
                    queue.popleft()
                    continue
            chunk = min(op.end - op.off, space)
            real = max(0, min(n - op.off, chunk))
            if real:
                ring.put(tail, op.mem[op.off : op.off + real])
            tail, space, op.off = tail + chunk, space - chunk, op.off + chunk
            if op.off < op.end:
                break
            op.done = True
            queue.popleft()
        self._tail[peer] = tail
        ring.tail[0] = tail
        return tail != was


def _ring_offset(src: int, dst: int, ring_bytes: int) -> int:
    """Where the ring that carries ``src``'s messages to ``dst`` starts in ``dst``'s file."""
    slot = src if src < dst else src - 1
    return slot * (RING_HEAD + ring_bytes)
