"""A stricter stand-in for ``cupy.cuda.nccl``: NCCL's rules that hang or corrupt, made visible.

Same call signatures as cupy >= 14 (see tests/helpers/nccl_standin.py), bytes moved
through the job's TCPStore (so a rank may die without taking the others
down, as under gloo), and these of NCCL's rules modelled:

* **Messages match as NCCL's do**: per peer and direction, in the order the
  calls were issued (at ``groupEnd``), without tags, whatever call issued
  them: an ``allReduce`` sends one message to and receives one from every
  peer in that same order. So a send issued on one thread between two
  collectives issued on another lands where NCCL would land it.
* **Creation is collective**: ``NcclCommunicator`` returns once every rank
  of it has called it; a subset hangs, and :class:`StandInHang` names the
  ranks that never came.
* **A refused call poisons its group**, as NCCL's group error does: inside
  a group, a call NCCL refuses (a bad peer or dtype, an aborted
  communicator) raises, and ``groupEnd`` raises it again and launches
  nothing of the group (:attr:`StrictNccl.launched` lists what launched).
  A call refused before NCCL sees it (cupy's argument conversion, a
  TypeError) leaves no such mark.
* **Connections block.** The first send from A to B (a *direction*) sets up
  a connection inside ``groupEnd()``: A's ``groupEnd`` does not return
  until B has reached a ``groupEnd`` of a group holding the matching
  receive from A, and the other way round. Real NCCL waits forever; this
  one raises :class:`StandInHang` after ``hang_s`` so a test ends.
* **Counts and dtypes must match.** Each message carries the sender's
  count and dtype code; a receive that disagrees is :class:`NcclMismatch`
  (reported by ``check_async_error()``, as NCCL reports asynchronous
  errors), never a silent partial copy.
* **Group depth is per thread** (``groupStart`` on one thread never opens a
  group for another).
* **Completion is asynchronous.** ``groupEnd`` enqueues the group on its
  stream (:class:`HostStream`, a thread that runs its work in order) and
  returns; a send holds its stream until the receiver has taken the data.
  Completion is seen through events (``stream.record().query()``).
* ``abort()`` unblocks everything at once; ``destroy()`` first waits for the
  pending work (real NCCL's ``ncclCommDestroy`` does, and hangs when a peer
  never comes: here :class:`StandInHang` after ``hang_s``).
* **Garbage collection destroys.** A communicator collected while neither
  aborted nor destroyed calls ``destroy()``, as cupy's ``__dealloc__`` does.

Modes (keyword arguments of :class:`StrictNccl`), each one of NCCL's ways
to block that the default leaves out:

* ``abort_blocks``: ``abort()`` hangs (NVIDIA/nccl#863, #1777) until
  :attr:`StrictNccl.release` is set, or ``hang_s``;
* ``collective_destroy``: ``destroy()`` also waits for every rank's
  ``destroy()`` (a rank whose peers never close hangs in it);
* ``lazy_connect``: a communicator's first ``allReduce`` blocks inside the
  call until every rank has made its own (NCCL >= 2.22 connects lazily);
* ``device_streams``: completion is seen as on a CUDA stream: the transport
  does not wait on the host for a group (``NcclTransport.host_waits``), so
  only the caller's own host wait (``sync()``) sees a receive land.

It verifies commrt's adapter and protocols against these rules; it says
nothing about NCCL, CUDA streams or a GPU.
"""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import itertools
import os
import queue
import struct
import threading
import time
import weakref

import numpy as np
import torch.distributed as dist

from commrt.transports.nccl_module import NcclModule

# ncclDataType_t -> (bytes per element, numpy dtype or None)
DTYPES = {
    0: (1, np.int8),
    1: (1, np.uint8),
    2: (4, np.int32),
    3: (4, np.uint32),
    4: (8, np.int64),
    5: (8, np.uint64),
    6: (2, np.float16),
    7: (4, np.float32),
    8: (8, np.float64),
    9: (2, None),
}
NAMES = {0: "int8", 1: "uint8", 2: "int32", 4: "int64", 6: "float16", 7: "float32", 9: "bf16"}
NAMES.update({3: "uint32", 5: "uint64", 8: "float64"})
NCCL_SUM, NCCL_MAX, NCCL_AVG = 0, 2, 4
_HEADER = struct.Struct("<qq")  # count, dtype code


class NcclError(RuntimeError):
    """What cupy raises for an NCCL failure."""


class NcclMismatch(NcclError):
    """A send and its receive disagree on the count or the dtype (real NCCL hangs or
    corrupts memory)."""


class NcclAborted(NcclError):
    """The communicator was aborted while this call waited."""


class StandInHang(NcclError):
    """Real NCCL would wait forever here; the stand-in gives up after ``hang_s``."""


def _store_from_env():
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=60))
    return dist.PrefixStore("nccl-strict", store)


class HostStream:
    """A stream: a thread running its work items in order; events mark points in it."""

    _ptrs = itertools.count(0x5000)

    def __init__(self):
        self.ptr = next(HostStream._ptrs)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="strict-stream", daemon=True)
        self._thread.start()

    def enqueue(self, work) -> None:
        self._q.put(work)

    def record(self) -> "HostEvent":
        ev = HostEvent()
        self._q.put(ev.flag.set)
        return ev

    def _run(self) -> None:
        while True:
            work = self._q.get()
            try:
                work()
            except BaseException:  # the work reports its own errors; keep the stream alive
                pass


class HostEvent:
    def __init__(self):
        self.flag = threading.Event()

    def query(self) -> bool:
        return self.flag.is_set()


class StrictNccl(NcclModule):
    """Module-like object: ``commrt.init("nccl", nccl_module=StrictNccl(), device="cpu")``."""

    def __init__(
        self,
        store=None,
        *,
        hang_s: float = 30.0,
        abort_blocks: bool = False,
        collective_destroy: bool = False,
        lazy_connect: bool = False,
        device_streams: bool = False,
    ):
        self.store = store if store is not None else _store_from_env()
        self.hang_s = hang_s
        self.abort_blocks, self.collective_destroy = abort_blocks, collective_destroy
        self.lazy_connect, self.device_streams = lazy_connect, device_streams
        #: set to let a blocked ``abort()`` return (``abort_blocks``)
        self.release = threading.Event()
        self._local = threading.local()
        self.streams: dict[int, HostStream] = {}
        self.comms: weakref.WeakSet = weakref.WeakSet()  # (weak: collecting one is modelled)
        self.calls: list[tuple] = []  # (op, count, dtype code, peer) for tests to inspect
        #: what groupEnd (or a call outside a group) launched: (op, count, dtype code, peer)
        self.launched: list[tuple] = []
        self.communicator = type("NcclCommunicator", (Communicator,), {"nccl": self})

    # ---- cupy.cuda.nccl's module functions
    def get_unique_id(self):
        return os.urandom(128)

    def NcclCommunicator(self, ndev, commId, rank):  # noqa: N802,N803
        return self.communicator(ndev, commId, rank)

    def HostStream(self) -> HostStream:  # noqa: N802 (the transport asks the module for one)
        s = HostStream()
        self.streams[s.ptr] = s
        return s

    @property
    def depth(self) -> int:
        """Open ``groupStart()`` calls on the calling thread."""
        return getattr(self._local, "depth", 0)

    def groupStart(self):  # noqa: N802
        self._local.depth = self.depth + 1
        if self._local.depth == 1:
            self._local.ops, self._local.error = [], None

    def groupEnd(self):  # noqa: N802
        if self.depth == 0:
            raise NcclError("groupEnd without groupStart (on this thread)")
        self._local.depth -= 1
        if self._local.depth == 0:
            ops, self._local.ops = self._local.ops, []
            error, self._local.error = self._local.error, None
            if error is not None:  # NCCL launches nothing of a group in which a call failed
                raise error
            for comm in dict.fromkeys(op[0] for op in ops):
                comm._launch([op[1:] for op in ops if op[0] is comm])

    def refuse(self, error: NcclError) -> None:
        """Raise ``error`` for a call NCCL refuses; inside a group NCCL also keeps it, and
        ``groupEnd`` then returns it and launches nothing."""
        if self.depth and self._local.error is None:
            self._local.error = error
        raise error

    def add(self, comm, op: tuple) -> None:
        self.calls.append((op[0], op[2], op[3], op[4]))
        if self.depth:
            self._local.ops.append((comm, *op))
        else:
            comm._launch([op])

    def wait_key(self, key: str, comm, what: str, deadline: float) -> None:
        """Poll until ``key`` is in the store; raise NcclAborted or StandInHang."""
        pause = 1e-4
        while not self.store.check([key]):
            if comm.aborted:
                raise NcclAborted(f"rank {comm.rank}: aborted while waiting for {what}")
            if time.monotonic() > deadline:
                raise StandInHang(
                    f"rank {comm.rank}: still waiting for {what} after {self.hang_s:g} s "
                    f"(real NCCL waits forever here)"
                )
            time.sleep(pause)
            pause = min(2e-3, pause * 2)


class Communicator:
    """``cupy.cuda.nccl.NcclCommunicator``'s calls, over the store (see the module docs)."""

    nccl: StrictNccl

    def __init__(self, ndev, commId, rank):  # noqa: N803
        if not isinstance(commId, bytes):
            raise TypeError(f"Argument 'commId' has incorrect type (got {type(commId).__name__})")
        if len(commId) != 128:
            raise ValueError(f"ncclUniqueId must be 128 bytes, got {len(commId)}")
        self.rank, self.size = rank, ndev
        self.cid = hashlib.sha1(commId).hexdigest()[:12]
        self.aborted = self.destroyed = False
        self.error: NcclError | None = None
        self.connected: set[tuple[str, int]] = set()  # ("send", peer) / ("recv", peer)
        #: the next message number per direction and peer: ("send", peer) / ("recv", peer)
        self.seq: dict[tuple[str, int], int] = {}
        self.lazy_connected = False  # lazy_connect: the first allReduce connected
        self.pending = 0  # groups enqueued and not yet finished
        self.lock = threading.Lock()
        store, deadline = self.nccl.store, time.monotonic() + self.nccl.hang_s
        store.set(f"{self.cid}/init/{rank}", "1")
        self._all_created(deadline)
        self.nccl.comms.add(self)

    def _all_created(self, deadline: float) -> None:
        """Creation is collective: wait until every rank of the communicator has called it;
        a subset hangs (real NCCL: forever), and the stand-in names every rank missing."""
        keys = [f"{self.cid}/init/{r}" for r in range(self.size)]
        try:
            for key in keys:
                self.nccl.wait_key(key, self, "every rank to create", deadline)
        except StandInHang:
            missing = [r for r, key in enumerate(keys) if not self.nccl.store.check([key])]
            raise StandInHang(
                f"rank {self.rank}: creating a communicator of {self.size} ranks waits for "
                f"ranks {missing}, which never called it, after {self.nccl.hang_s:g} s "
                "(real NCCL waits forever here)"
            ) from None

    # ---- the calls
    def send(self, ptr, count, datatype, peer, stream):
        self._check_args(ptr, count, datatype, peer, stream)
        self.nccl.add(self, ("send", ptr, count, datatype, peer, stream))

    def recv(self, ptr, count, datatype, peer, stream):
        self._check_args(ptr, count, datatype, peer, stream)
        self.nccl.add(self, ("recv", ptr, count, datatype, peer, stream))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        self._check_args(sendbuf, count, datatype, None, stream)
        if self.nccl.lazy_connect and not self.lazy_connected:
            self._meet("lazy", "allReduce (connecting lazily, in the call)")
            self.lazy_connected = True
        self.nccl.add(self, ("allreduce", (sendbuf, recvbuf, op), count, datatype, -1, stream))

    def check_async_error(self):
        if self.error is not None:
            raise self.error

    def abort(self):
        if self.nccl.abort_blocks and not self.nccl.release.wait(self.nccl.hang_s):
            raise StandInHang(f"rank {self.rank}: abort() hung (real NCCL: forever)")
        self.aborted = True

    def destroy(self):
        deadline = time.monotonic() + self.nccl.hang_s
        while self.pending and not self.aborted:  # ncclCommDestroy waits for pending work
            if time.monotonic() > deadline:
                raise StandInHang(
                    f"rank {self.rank}: destroy() waits for {self.pending} pending group(s) "
                    f"after {self.nccl.hang_s:g} s (real NCCL hangs here; abort() first)"
                )
            time.sleep(1e-3)
        if self.nccl.collective_destroy:
            self._meet("destroy", "destroy()")
        self.destroyed = True

    def __del__(self):
        # cupy's __dealloc__: a communicator neither aborted nor destroyed is destroyed here
        if not (getattr(self, "aborted", True) or getattr(self, "destroyed", True)):
            self.destroy()

    def _meet(self, what: str, call: str) -> None:
        """Block until every rank has reached ``what`` (collective, inside the call)."""
        deadline = time.monotonic() + self.nccl.hang_s
        self.nccl.store.set(f"{self.cid}/{what}/{self.rank}", "1")
        for r in range(self.size):
            self.nccl.wait_key(f"{self.cid}/{what}/{r}", self, f"rank {r} in {call}", deadline)

    def _check_args(self, ptr, count, datatype, peer, stream):
        """What cupy refuses before NCCL sees the call (a TypeError, nothing recorded), and
        what NCCL refuses (invalid usage or argument, recorded in an open group)."""
        if not all(isinstance(x, int) for x in (ptr, count, stream)):
            raise TypeError("pointer, count and stream must be integers")
        if self.aborted or self.destroyed:
            self.nccl.refuse(NcclError(f"rank {self.rank}: communicator used after abort"))
        if datatype not in DTYPES:
            self.nccl.refuse(NcclError(f"invalid argument: bad datatype code {datatype}"))
        if peer == self.rank:
            self.nccl.refuse(NcclError("invalid argument: NCCL send/recv to self"))
        if peer is not None and not 0 <= peer < self.size:
            self.nccl.refuse(NcclError(f"invalid argument: peer {peer} of {self.size} ranks"))
        if stream not in self.nccl.streams:
            self.nccl.refuse(NcclError(f"stream {stream:#x} is not a stream of this stand-in"))

    # ---- groupEnd: connect (blocking, on the host), then enqueue on the stream
    def _launch(self, ops: list[tuple]) -> None:
        streams = {op[5] for op in ops}
        if len(streams) != 1:
            raise ValueError("the stand-in runs one group on one stream")
        self._connect(ops)
        numbered = []
        for kind, ptr, count, dtype, peer, _ in ops:
            self.nccl.launched.append((kind, count, dtype, peer))
            if kind == "allreduce":  # one message each way with every peer, in their order
                n = {r: (self._next("send", r), self._next("recv", r)) for r in self._others()}
            else:
                n = self._next(kind, peer)
            numbered.append((kind, ptr, count, dtype, peer, n))
        with self.lock:
            self.pending += 1
        self.nccl.streams[streams.pop()].enqueue(lambda: self._run(numbered))

    def _connect(self, ops) -> None:
        """A direction's first message waits, inside groupEnd, for the peer's matching group."""
        new = []
        for kind, _, _, _, peer, _ in ops:
            if kind in ("send", "recv") and (kind, peer) not in self.connected:
                src, dst = (self.rank, peer) if kind == "send" else (peer, self.rank)
                self.nccl.store.set(f"{self.cid}/c/{src}/{dst}/{kind}", "1")
                other = "recv" if kind == "send" else "send"
                new.append((kind, peer, f"{self.cid}/c/{src}/{dst}/{other}"))
        deadline = time.monotonic() + self.nccl.hang_s
        for kind, peer, key in new:
            what = f"rank {peer} to reach a group with the matching {kind} (first connection)"
            self.nccl.wait_key(key, self, what, deadline)
            self.connected.add((kind, peer))

    # ---- on the stream
    def _run(self, ops) -> None:
        try:
            if not self.aborted:
                self._move(ops)
        except NcclError as e:
            self.error = self.error or e
        except Exception as e:  # a bug in the stand-in or a bad pointer: report it too
            self.error = self.error or NcclError(f"rank {self.rank}: {e!r}")
        finally:
            with self.lock:
                self.pending -= 1

    def _next(self, kind: str, peer: int) -> int:
        n = self.seq.get((kind, peer), 0)
        self.seq[(kind, peer)] = n + 1
        return n

    def _others(self) -> list[int]:
        return [r for r in range(self.size) if r != self.rank]

    def _move(self, ops) -> None:
        """Sends (an all-reduce's contribution to each peer among them), then receives, then
        each send's acknowledgement: messages match per peer in the order they were issued,
        whatever call issued them, as NCCL's do (no tags)."""
        deadline = time.monotonic() + self.nccl.hang_s
        sends, recvs = [], []  # (ptr, count, dtype, peer, n); a receive's ptr None: kept
        reduced = []  # (recvbuf, op, count, dtype, [own contribution + each peer's])
        for kind, ptr, count, dtype, peer, n in ops:
            if kind == "send":
                sends.append((ptr, count, dtype, peer, n))
            elif kind == "recv":
                recvs.append((ptr, count, dtype, peer, n))
            else:
                sendbuf, recvbuf, op = ptr
                if DTYPES[dtype][1] is None:
                    raise NcclError("the stand-in cannot reduce bf16")
                parts = [ctypes.string_at(sendbuf, count * DTYPES[dtype][0])]
                reduced.append((recvbuf, op, count, dtype, parts))
                for r, (out, into) in n.items():
                    sends.append((sendbuf, count, dtype, r, out))
                    recvs.append((parts, count, dtype, r, into))
        for ptr, count, dtype, peer, n in sends:
            data = ctypes.string_at(ptr, count * DTYPES[dtype][0]) if count else b""
            self.nccl.store.set(self._msg(self.rank, peer, n), _HEADER.pack(count, dtype) + data)
        for ptr, count, dtype, peer, n in recvs:
            self._receive(ptr, count, dtype, peer, n, deadline)
        for recvbuf, op, count, dtype, parts in reduced:
            _reduce(recvbuf, op, count, dtype, parts, self.size)
        for _, count, dtype, peer, n in sends:  # a send holds the stream until it is taken
            ack = self._msg(self.rank, peer, n) + "/ack"
            self.nccl.wait_key(ack, self, f"rank {peer} to receive message {n}", deadline)
            verdict = bytes(self.nccl.store.get(ack)).decode()
            self.nccl.store.delete_key(ack)
            if verdict != "ok":
                raise NcclMismatch(f"rank {self.rank} sends {_what(count, dtype)} to {verdict}")

    def _receive(self, into, count, dtype, peer, n, deadline) -> None:
        """Message ``n`` from ``peer`` into the pointer ``into``, or appended to the list
        ``into`` (an all-reduce's part)."""
        store, key = self.nccl.store, self._msg(peer, self.rank, n)
        self.nccl.wait_key(key, self, f"message {n} from rank {peer}", deadline)
        raw = bytes(store.get(key))
        store.delete_key(key)
        got_count, got_dtype = _HEADER.unpack_from(raw)
        if (got_count, got_dtype) != (count, dtype):
            mine = f"rank {self.rank}, which receives {_what(count, dtype)}"
            store.set(key + "/ack", mine)
            raise NcclMismatch(
                f"rank {peer} sends {_what(got_count, got_dtype)} to rank {self.rank}, "
                f"which receives {_what(count, dtype)}"
            )
        if isinstance(into, list):
            into.append(raw[_HEADER.size :])
        elif count:
            ctypes.memmove(into, raw[_HEADER.size :], count * DTYPES[dtype][0])
        store.set(key + "/ack", "ok")

    def _msg(self, src: int, dst: int, n: int) -> str:
        return f"{self.cid}/m/{src}/{dst}/{n}"


def _reduce(recvbuf: int, op: int, count: int, dtype: int, parts: list, size: int) -> None:
    """Write the reduction of ``parts`` (raw bytes of ``count`` elements each) at ``recvbuf``."""
    nbytes, npdt = DTYPES[dtype]
    arrays = [np.frombuffer(p, dtype=npdt) for p in parts]
    wide = np.float64 if npdt().dtype.kind == "f" else np.int64
    if op == NCCL_MAX:
        total = np.maximum.reduce(arrays).astype(wide)
    else:
        total = np.sum([a.astype(wide) for a in arrays], axis=0)
    if op == NCCL_AVG:
        total /= size
    ctypes.memmove(recvbuf, total.astype(npdt).tobytes(), count * nbytes)


def _what(count: int, dtype: int) -> str:
    return f"{count} x {NAMES.get(dtype, dtype)}"


class MemoryStore:
    """An in-memory store with the TCPStore calls the stand-in uses, for ranks that are
    threads of one process."""

    def __init__(self):
        self.d, self.lock = {}, threading.Lock()

    def set(self, k, v):
        with self.lock:
            self.d[k] = v.encode() if isinstance(v, str) else bytes(v)

    def get(self, k):
        with self.lock:
            return self.d[k]

    def check(self, keys):
        with self.lock:
            return all(k in self.d for k in keys)

    def delete_key(self, k):
        with self.lock:
            return self.d.pop(k, None) is not None
