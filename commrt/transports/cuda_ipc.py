"""The ``cuda_ipc`` transport: ranks of one host move device memory through CUDA IPC.

NCCL refuses two ranks on one GPU; this transport does not. Each rank
allocates, per peer, a receive slab of :attr:`CudaIpcTransport.slots`
slots of ``slot_bytes`` in device memory and exports it; a send is a
device-to-device copy, on the sender's stream, into the receiver's slab.
Everything the host does is enqueued on the transport's own stream
(:meth:`~commrt.transports.cuda_ipc_device.IpcDevice.new_stream`), so the
transport is *stream-ordered* like NCCL: no host wait for device work
inside a schedule, one bounded wait at its end (:meth:`CudaIpcTransport.sync`).

One direction, sender S to receiver R (a :class:`Link`), is ordered by two
interprocess events per slot and two counters in shared host memory
(R's counters file, which S maps), as the ``shm`` transport keeps its
rings' counters. Piece ``n`` of the link's traffic (a message is cut into
pieces of at most one slot) goes into slot ``n % slots``:

* **S, before writing piece n** (:meth:`CudaIpcTransport.can_write`): R's
  host has recorded that it consumed piece ``n - slots`` (the counter
  ``consumed`` is past it); then S's stream waits on that slot's
  *consumed* event (:meth:`CudaIpcTransport.wait_consumed`), copies, and
  records the slot's *ready* event; then S's host publishes the message's
  size in the slot's header and raises ``posted`` to ``n + 1``.
* **R, before reading piece n** (:meth:`CudaIpcTransport.can_read`): ``posted``
  is past ``n``; then R's stream waits on the slot's *ready* event
  (:meth:`CudaIpcTransport.wait_ready`), copies out, records *consumed*, and
  R's host raises ``consumed`` to ``n + 1``.

The host counters are needed because a stream wait sees only the most
recent record issued *before* it: a wait issued before the peer's host
recorded would let the copy run early. Each of the four waits has a test
that fails without it (tests/multiprocess/test_cuda_ipc_order.py).

Messages match as NCCL's do: per peer, in the order they were issued, no
tags. A receive whose size differs from the message's (its header) is a
named error, never a silent partial copy.

On CPU tensors (the stand-in device of the tests) the executor reduces on
the host, so a receive's wait also waits, bounded, until its copy-out ran,
and a send's until its copy-in ran (:attr:`CudaIpcTransport.host_waits`).

Failure. A peer that dies leaves its counters still: a wait longer than a
few milliseconds asks, every :data:`commrt.transports.base.CHECK_EVERY_S`,
whether the peers it waits on still run (pid and start time, as shm does).
Every host wait is a poll with a deadline, so no call blocks in C code
and no watchdog thread is needed; but device work cannot be withdrawn, so
a timeout or an error marks the transport unusable (:attr:`broken`), as an
NCCL abort does, and every later call raises that by name.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Sequence

import numpy as np
import torch

from commrt import settings
from commrt.errors import CommError
from commrt.transports import traits as engine
from commrt.transports.base import (
    Pair,
    Pending,
    Transport,
    exchange_barrier,
    ordered_sum,
    poll_until,
)
from commrt.transports.cuda_ipc_device import IpcDevice
from commrt.transports.cuda_ipc_direct import SUMS, Workspace
from commrt.transports.cuda_ipc_host import HOST_BYTES, HostWorkspace
from commrt.transports.processes import start_time

#: slots per direction (pieces in flight between two ranks)
SLOTS = 4
#: bytes per slot, unless asked otherwise (COMMRT_CUDA_IPC_SLOT_BYTES's default)
SLOT_BYTES: int = settings.CUDA_IPC_SLOT_BYTES.value.default
CLOSE_S = settings.Seconds(
    30.0,
    "how long a closing rank waits for its stream, then for every peer's, before it frees what "
    "their copies touch (past it, with a peer still running, it frees nothing)",
    "`close()` of the `cuda_ipc` transport",
    settings.STALLS,
)
CLOSE_POLL_S = settings.Seconds(
    0.01,
    "how often that close looks in the store for the peers' word",
    "`close()` of the `cuda_ipc` transport",
    settings.STALLS,
)
#: a link's block in the receiver's counters file: ``posted`` (the sender's cache line),
#: ``consumed`` (the receiver's), then one size header per slot (the sender's)
HEAD = 128


def link_bytes(slots: int) -> int:
    """Bytes of one link's counters block (a multiple of a cache line)."""
    return HEAD + ((8 * slots + 63) // 64) * 64


class Tally:
    """What this rank's transport waited on and launched, counted as it happens (tests
    read it through :func:`commrt.testing.counted`).

    ``peer_waits``: per peer, the cross-process waits: each wait whose end depends on
    that peer (a poll of its counter in ``/dev/shm``, a stream's wait on its IPC event);
    ``launches``: copies, sums and host functions enqueued on the stream;
    ``stream_waits``: the host's waits for this rank's own stream."""

    __slots__ = ("peer_waits", "launches", "stream_waits")

    def __init__(self):
        self.peer_waits: Counter = Counter()
        self.launches = self.stream_waits = 0

    def peer_wait(self, peer: int, n: int = 1) -> None:
        self.peer_waits[peer] += n


class Link:
    """One direction between two ranks, as one side sees it: the slab (the receiver's
    memory, opened by the sender), the slot events, the shared counters."""

    __slots__ = ("peer", "slab", "ready", "consumed", "posted_n", "consumed_n", "sizes", "next")

    def __init__(self, peer: int, slab: int, ready: list, consumed: list, block: np.ndarray):
        self.peer, self.slab, self.ready, self.consumed = peer, slab, ready, consumed
        words = block.view(np.uint64)
        self.posted_n, self.consumed_n = words[0:1], words[8:9]
        self.sizes = words[HEAD // 8 : HEAD // 8 + len(ready)]
        #: the next piece this side issues (sender: writes, receiver: reads)
        self.next = 0


class Message:
    """One send or receive: its tensor, how many pieces are issued, the last slot used.

    The message holds its tensor, so memory a queued piece will copy cannot be freed
    and reused before the piece is issued (a caller may drop the tensor as soon as the
    call returns: gossip's late letters, a cancelled exchange). Once issued, the
    stream's copy is covered by ``begin`` (``record_stream`` on CUDA), and on the
    stand-in by the host waits; the pending exchange holds the message until then."""

    __slots__ = ("tensor", "ptr", "nbytes", "pieces", "issued", "last")

    def __init__(self, t: torch.Tensor, slot_bytes: int):
        if not t.is_contiguous():
            raise ValueError(f"cuda_ipc moves contiguous tensors only; got strides {t.stride()}")
        self.tensor = t
        self.ptr, self.nbytes = t.data_ptr(), t.numel() * t.element_size()
        self.pieces = max(1, -(-self.nbytes // slot_bytes))
        self.issued, self.last = 0, -1

    @property
    def done_issuing(self) -> bool:
        return self.issued == self.pieces


class IpcPending(Pending):
    """An exchange's sends and receives: a wait issues what the peers' counters allow,
    and on the host (CPU tensors only) waits for the copies themselves."""

    __slots__ = ("transport", "sends", "recvs")

    def __init__(self, transport: "CudaIpcTransport", sends: list, recvs: list):
        self.transport, self.sends, self.recvs = transport, sends, recvs

    def wait_recv(self, i: int, deadline: float) -> bool:
        peer, msg = self.recvs[i]
        return self.transport.wait(peer, msg, False, deadline)

    def wait_send(self, i: int, deadline: float) -> bool:
        peer, msg = self.sends[i]
        return self.transport.wait(peer, msg, True, deadline)


def issue_all(queues: dict, links: dict, can, issue) -> bool:
    """Issue, for each peer's queue of messages, every piece its link allows now
    (``can(link, n)``), in order (``issue(link, message)``); whether any was issued."""
    moved = False
    for peer, queue in queues.items():
        link = links[peer]
        while queue and can(link, link.next):
            issue(link, queue[0])
            moved = True
            if queue[0].done_issuing:
                queue.popleft()
    return moved


class CudaIpcTransport(Transport):
    """Point-to-point between the ranks of one host through shared device memory. Made by
    :func:`commrt.transports.cuda_ipc_connect.connect`, every rank together."""

    name = "cuda_ipc"
    traits = engine.CUDA_IPC
    #: the store the ranks met through, and the prefix of this transport's keys in it
    #: (a rank that closed says so there); set by connect()
    store, keys = None, ""

    def __init__(self, rank, world_size, dev: IpcDevice, links, pids, slot_bytes, release):
        """``links``: peer -> (outbound :class:`Link`, inbound :class:`Link`); ``pids``:
        peer -> (pid, start time); ``release()`` frees what connect() made."""
        super().__init__(rank, world_size, dev.device)
        self.dev, self.slot_bytes, self.pids = dev, slot_bytes, pids
        self.out = {p: pair[0] for p, pair in links.items()}
        self.inb = {p: pair[1] for p, pair in links.items()}
        self.sendq: dict[int, deque] = {p: deque() for p in links}
        self.recvq: dict[int, deque] = {p: deque() for p in links}
        #: whether waits also wait for the copies on the host (CPU tensors: the
        #: executor reduces on the host, not on the stream)
        self.host_waits = dev.device.type != "cuda"
        self.dev_stream = dev.new_stream()
        self.mark = dev.create_event()  # "everything enqueued so far", for sync()
        self.lock = threading.RLock()
        #: why the transport can no longer be used (None while it can)
        self.broken: str | None = None
        self._release = release
        self.tally = Tally()
        #: the one-shot workspace (commrt.transports.cuda_ipc_direct), made at the first call
        self.workspace: Workspace | None = None
        #: the one-shot summed on the host (commrt.transports.cuda_ipc_host), made likewise
        self.host_workspace: HostWorkspace | None = None
        #: the largest one-shot summed on the host (bytes; set by connect, the same on
        #: every rank)
        self.host_bytes = HOST_BYTES

    # -- the ordering rules, one method each (see the module docs)
    def can_write(self, link: Link, n: int) -> bool:
        """Whether the receiver's host recorded consuming the piece slot ``n`` last held."""
        return n < len(link.ready) or int(link.consumed_n[0]) > n - len(link.ready)

    def wait_consumed(self, link: Link, slot: int) -> None:
        """Make this stream wait until the receiver's stream read slot ``slot`` out."""
        self.dev.wait_event(self.dev_stream, link.consumed[slot])

    def can_read(self, link: Link, n: int) -> bool:
        """Whether the sender's host recorded writing piece ``n``."""
        return int(link.posted_n[0]) > n

    def wait_ready(self, link: Link, slot: int) -> None:
        """Make this stream wait until the sender's stream wrote slot ``slot``."""
        self.dev.wait_event(self.dev_stream, link.ready[slot])

    # -- issuing pieces (under the lock)
    def _write(self, link: Link, msg: Message) -> None:
        n, slot, size = link.next, link.next % len(link.ready), self.slot_bytes
        off = msg.issued * size
        if n >= len(link.ready):  # the slot was used: its counter and event are the peer's
            self.tally.peer_wait(link.peer, 2)
        self.tally.launches += 1
        self.wait_consumed(link, slot)
        self.dev.copy(
            link.slab + slot * size, msg.ptr + off, min(size, msg.nbytes - off), self.dev_stream
        )
        self.dev.record(link.ready[slot], self.dev_stream)
        link.sizes[slot] = msg.nbytes
        link.posted_n[0] = n + 1
        link.next, msg.issued, msg.last = n + 1, msg.issued + 1, slot

    def _read(self, link: Link, msg: Message) -> None:
        n, slot, size = link.next, link.next % len(link.ready), self.slot_bytes
        sent = int(link.sizes[slot])
        if sent != msg.nbytes:
            self.broken = (
                f"message truncated: rank {link.peer} sent {sent} bytes where {msg.nbytes} "
                "were posted for it (cuda_ipc matches per peer in issue order, as NCCL does)"
            )
            raise RuntimeError(f"cuda_ipc: rank {self.rank}: {self.broken}")
        off = msg.issued * size
        self.tally.peer_wait(link.peer, 2)  # its posted counter, then its ready event
        self.tally.launches += 1
        self.wait_ready(link, slot)
        self.dev.copy(
            msg.ptr + off, link.slab + slot * size, min(size, msg.nbytes - off), self.dev_stream
        )
        self.dev.record(link.consumed[slot], self.dev_stream)
        link.consumed_n[0] = n + 1
        link.next, msg.issued, msg.last = n + 1, msg.issued + 1, slot

    def progress(self) -> bool:
        """Issue every piece the peers' counters allow, in each link's order; whether any."""
        with self.lock:
            self._usable()
            moved = issue_all(self.sendq, self.out, self.can_write, self._write)
            return issue_all(self.recvq, self.inb, self.can_read, self._read) or moved

    # -- the interface
    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        """Queue ``sends`` and ``recvs`` behind what each link has queued (no tags: per
        peer, in issue order) and issue what can go now."""
        smsgs = [(p, Message(t, self.slot_bytes)) for t, p in sends]
        rmsgs = [(p, Message(t, self.slot_bytes)) for t, p in recvs]
        with self.lock:
            self._usable()
            for p, m in smsgs:
                self.sendq[p].append(m)
            for p, m in rmsgs:
                self.recvq[p].append(m)
        self.progress()
        return IpcPending(self, smsgs, rmsgs)

    def wait(self, peer: int, msg: Message, send: bool, deadline: float) -> bool:
        """Until ``msg`` is issued (and, with :attr:`host_waits`, its copies ran); False
        at the deadline, which breaks the transport (issued work cannot be withdrawn).
        A deadline already past is a test: it issues what it can and breaks nothing."""
        asked = time.monotonic()
        link = (self.out if send else self.inb)[peer]
        events = link.ready if send else link.consumed

        def done() -> bool:
            if not msg.done_issuing:
                self.progress()
                if not msg.done_issuing:
                    return False
            return not self.host_waits or self.dev.query(events[msg.last])

        self.tally.stream_waits += self.host_waits
        if poll_until(done, deadline, check=lambda: self.check_peers([peer])):
            return True
        if deadline > asked:
            self.broken = f"a {'send to' if send else 'receive from'} rank {peer} timed out"
        return False

    def check_peers(self, peers) -> None:
        """Raise if this rank's departures record a farewell, or a peer's process is gone."""
        if self.departures is not None:
            self.departures.check()
        for p in peers:
            pid, started = self.pids[p]
            if start_time(pid) != started:
                self.broken = f"rank {p}'s process (pid {pid}) is gone"
                raise RuntimeError(
                    f"cuda_ipc: rank {p}'s process (pid {pid}) is gone while rank {self.rank} "
                    "waits on it"
                )

    def _usable(self) -> None:
        if self.broken is not None:
            raise CommError(
                f"commrt: rank {self.rank}: the cuda_ipc transport is unusable ({self.broken}); "
                "device copies cannot be withdrawn, so it was given up: make a new communicator"
            )

    def stream(self):
        return self.dev.stream_context(self.dev_stream)

    def begin(self, tensor: torch.Tensor) -> None:
        self.dev.after_caller(self.dev_stream, tensor)

    def end(self, tensor: torch.Tensor) -> None:
        self.dev.caller_after(self.dev_stream)

    def sync(self, deadline: float) -> bool:
        """Host-wait, bounded, until everything enqueued on the stream so far has run;
        a dead peer is named meanwhile (its events may never complete)."""
        with self.lock:
            self._usable()
            self.dev.record(self.mark, self.dev_stream)
        self.tally.stream_waits += 1
        peers = list(self.pids)
        if poll_until(
            lambda: self.dev.query(self.mark), deadline, check=lambda: self.check_peers(peers)
        ):
            return True
        self.broken = "the stream's work did not finish in time"
        return False

    def runs_whole(self, schedule, buf: torch.Tensor, reduce) -> bool:
        """A one-shot all-reduce of every rank, summed, in a dtype the workspace sums:
        through the workspace, summed on the host up to :attr:`host_bytes`
        (:mod:`commrt.transports.cuda_ipc_host`), else on the device
        (:mod:`commrt.transports.cuda_ipc_direct`)."""
        return (
            schedule.name.rpartition(":")[2] == "one_shot"  # also auto's "auto:one_shot"
            and reduce is None
            and buf.dtype in SUMS
            and schedule.span is None
            and len(schedule.ranks) == self.world_size > 1
        )

    def run_whole(self, buf: torch.Tensor, deadline: float) -> int | None:
        with self.lock:
            self._usable()
            space = self._workspace(buf.numel() * buf.element_size(), deadline)
            late = space.all_reduce(buf, deadline)
            if late is not None:
                self.broken = f"the one-shot wait on rank {late} timed out"
            return late

    def _workspace(self, nbytes: int, deadline: float) -> "Workspace | HostWorkspace":
        """Where a one-shot of ``nbytes`` is summed: on the host up to :attr:`host_bytes`
        (every rank decides alike), else on the device; made at its first call."""
        timeout = max(1.0, deadline - time.monotonic())
        if nbytes <= self.host_bytes:
            if self.host_workspace is None:
                self.host_workspace = HostWorkspace(self, self.host_bytes)
                self.host_workspace.make(timeout)
            return self.host_workspace
        if self.workspace is None:
            self.workspace = Workspace(self)
            self.workspace.make(timeout)
        return self.workspace

    def barrier(self, timeout: float) -> bool:
        return exchange_barrier(self, timeout, 0)

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """The oracle: a direct exchange summed in rank order
        (:func:`~commrt.transports.base.ordered_sum`)."""
        ordered_sum(self, tensor, op, 0)

    def close(self) -> None:
        """Wait (bounded) for this rank's stream, then for every peer's (:func:`all_ran`),
        then unmap the peers' memory and free this rank's slab and events. A broken
        transport, or a peer still running that does not close within :data:`CLOSE_S`,
        frees nothing a pending copy or a stream's wait may still touch (the process's
        end frees it)."""
        with self.lock:
            release, self._release = self._release, None
        if release is None:
            return
        clean = self.broken is None
        if clean:
            try:
                clean = self.sync(time.monotonic() + CLOSE_S)
                clean = clean and all_ran(self, time.monotonic() + CLOSE_S)
            except (CommError, RuntimeError):
                clean = False
        self.broken = self.broken or "the transport is closed"
        for space in (self.workspace, self.host_workspace):
            if space is not None:
                space.release(clean)
        release(clean)


def all_ran(transport: CudaIpcTransport, deadline: float) -> bool:
    """Say in the store that ``transport``'s rank's stream ran to its end, and wait until every
    peer said so or its process is gone: then no stream still copies into this rank's
    slab or waits on its events. False at ``deadline``, or if the store is gone."""
    if transport.store is None or transport.world_size == 1:
        return True
    transport.store.set(f"{transport.keys}closed/{transport.rank}", "1")
    waiting = [p for p in transport.pids if p != transport.rank]
    while waiting:
        waiting = [
            p
            for p in waiting
            if not transport.store.check([f"{transport.keys}closed/{p}"])
            and start_time(transport.pids[p][0]) == transport.pids[p][1]
        ]
        if waiting and time.monotonic() > deadline:
            return False
        if waiting:
            time.sleep(CLOSE_POLL_S)
    return True
