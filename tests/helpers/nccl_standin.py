"""A stand-in for ``cupy.cuda.nccl`` that moves host bytes over MPI.

Same call signatures as cupy >= 14 (``get_unique_id()``, module-level
``groupStart()``/``groupEnd()``, ``NcclCommunicator(ndev, commId, rank)``
with ``send/recv(ptr, count, datatype, peer, stream)`` and
``allReduce(sendbuf, recvbuf, count, datatype, op, stream)``). Byte counts
come from the dtype code through this file's own table, so a wrong code or
count in the adapter corrupts data or fails loudly. It keeps these of
NCCL's rules, so that it is never kinder than NCCL:

* **Creation is collective over the communicator's ranks only.** The unique
  id names the MPI rank that made it; every rank of the new communicator
  reports to that one, which hands out the member list, and the members
  make an MPI communicator of their own (``Create_group``: no other rank
  takes part). A subset hangs; the stand-in names the ranks that never came
  after ``hang_s`` (:class:`StandInHang`). A job can hold many
  communicators (the torch backend's group and one per point-to-point
  pair), each matching its messages apart from the others'.
* **Messages match per peer in issue order, without tags**, whatever call
  issued them: one MPI tag for everything, MPI's non-overtaking order, and
  an ``allReduce`` is one message to and one from every peer in that order.
* **Completion is asynchronous.** ``groupEnd`` (or a call outside a group)
  posts its operations and returns; they complete on the stream's worker
  thread (:class:`HostStream`), seen through events
  (``stream.record().query()``). A caller that reads a receive without
  waiting for it reads what was there before.

This checks commrt's NCCL adapter (grouping, pointers, counts, dtype codes,
unique-id rendezvous). It says nothing about NCCL, CUDA streams or GPUs.
It is lenient where NCCL hangs on a new pair's connection or on
mismatched counts: tests/helpers/nccl_strict.py models those rules.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time

import numpy as np
from mpi4py import MPI

from commrt.transports.nccl_module import NcclModule
from helpers.nccl_strict import HostStream, NcclError, StandInHang

# ncclDataType_t -> (bytes per element, numpy dtype or None)
_DTYPES = {
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
NCCL_SUM, NCCL_AVG = 0, 4
#: the MPI tag of every message between the ranks of one communicator
_TAG = 0
_ROOT = struct.Struct("<q")  # the unique id's first bytes: the MPI rank that made it


class StandInNccl(NcclModule):
    """Module-like object: pass it as ``commrt.init(..., nccl_module=StandInNccl())``."""

    def __init__(self, mpi_comm=None, hang_s: float = 60.0):
        self.mpi = (mpi_comm or MPI.COMM_WORLD).Dup()
        self.hang_s = hang_s
        self._local = threading.local()  # group depth and queued calls, per thread as NCCL's
        self.calls: list[tuple] = []  # (op, count, dtype code, peer, stream) for tests to inspect
        self.streams: dict[int, HostStream] = {}
        outer = self

        class NcclCommunicator(_Communicator):
            nccl = outer

        self.communicator = NcclCommunicator

    @property
    def depth(self) -> int:
        """How many ``groupStart()`` calls are still open on this thread (0 outside one)."""
        return getattr(self._local, "depth", 0)

    def get_unique_id(self) -> bytes:
        """128 bytes (cupy >= 14): this process's MPI rank, then random ones."""
        return _ROOT.pack(self.mpi.Get_rank()) + os.urandom(128 - _ROOT.size)

    def NcclCommunicator(self, ndev, commId, rank):  # noqa: N802,N803
        return self.communicator(ndev, commId, rank)

    def HostStream(self) -> HostStream:  # noqa: N802 (the transport asks the module for one)
        s = HostStream()
        self.streams[s.ptr] = s
        return s

    def groupStart(self):  # noqa: N802
        if self.depth == 0:
            self._local.queued = []
        self._local.depth = self.depth + 1

    def groupEnd(self):  # noqa: N802
        if self.depth == 0:
            raise RuntimeError("groupEnd without groupStart")
        self._local.depth -= 1
        if self._local.depth == 0:
            self._flush()

    def _add(self, comm, op: tuple) -> None:
        if self.depth == 0:
            self._local.queued = [(comm, op)]
            self._flush()
        else:
            self._local.queued.append((comm, op))

    def _flush(self) -> None:
        """Post the queued operations (receives first, as the old stand-in did) and let
        each stream complete its share on its worker thread."""
        queued, self._local.queued = self._local.queued, []
        by_stream: dict[int, list] = {}
        for comm, (kind, ptr, nbytes, peer, stream) in sorted(queued, key=_receives_first):
            by_stream.setdefault(stream, []).append(comm.post(kind, ptr, nbytes, peer))
        for stream, posted in by_stream.items():
            done = [p for p in posted if p is not None]
            work = lambda done=done: [finish() for finish in done]  # noqa: E731
            if stream in self.streams:
                self.streams[stream].enqueue(work)
            else:
                work()


def _receives_first(item) -> int:
    return 0 if item[1][0] == "recv" else 1


class _Communicator:
    """``cupy.cuda.nccl.NcclCommunicator``'s calls over an MPI communicator of its ranks."""

    nccl: StandInNccl

    def __init__(self, ndev, commId, rank):  # noqa: N803
        if not isinstance(commId, bytes):  # what cupy 14 raises (seen on an H100 box)
            raise TypeError(
                f"Argument 'commId' has incorrect type (expected bytes, got "
                f"{type(commId).__name__})"
            )
        if len(commId) != 128:
            raise ValueError(f"ncclUniqueId must be 128 bytes, got {len(commId)}")
        if not 0 <= rank < ndev:
            raise NcclError(f"invalid argument: rank {rank} of {ndev}")
        self.rank, self.size, self.error = rank, ndev, None
        self.aborted = False
        tag = 1000 + int.from_bytes(hashlib.sha1(commId).digest()[:3], "little")
        members = self._meet(ndev, commId, rank, tag)
        world = self.nccl.mpi
        group = world.Get_group().Incl(members)
        self.mpi = world.Create_group(group, tag)
        group.Free()

    def _meet(self, ndev: int, uid: bytes, rank: int, tag: int) -> list[int]:
        """Every rank reports (id, its rank, its MPI rank) to the MPI rank that made the id,
        which answers with the MPI ranks in NCCL rank order; after ``hang_s`` it answers
        with the ranks that never came instead, and every rank that came names them."""
        world, hang_s = self.nccl.mpi, self.nccl.hang_s
        (root,) = _ROOT.unpack_from(uid)
        deadline = time.monotonic() + hang_s
        report = world.isend((uid, rank, world.Get_rank()), dest=root, tag=tag)
        if world.Get_rank() == root:
            seen: dict[int, int] = {}
            while len(seen) < ndev and time.monotonic() < deadline:
                if world.Iprobe(source=MPI.ANY_SOURCE, tag=tag):
                    got, r, where = world.recv(source=MPI.ANY_SOURCE, tag=tag)
                    if got == uid:
                        seen[r] = where
                else:
                    time.sleep(1e-3)
            missing = sorted(set(range(ndev)) - set(seen))
            answer = ("missing", missing) if missing else [seen[r] for r in range(ndev)]
            for where in set(seen.values()):
                world.send(answer, dest=where, tag=tag + 1)
        req = world.irecv(source=root, tag=tag + 1)
        while True:
            done, answer = req.test()
            if done:
                break
            if time.monotonic() > deadline + hang_s:  # the root itself never came
                req.Cancel()
                answer = ("missing", [f"{root} (the MPI rank that made the id)"])
                break
            time.sleep(1e-3)
        report.wait()
        if isinstance(answer, tuple):
            raise StandInHang(
                f"rank {rank}: creating a communicator of {ndev} ranks waits for ranks "
                f"{answer[1]}, which never called it, after {hang_s:g} s "
                "(real NCCL waits forever here)"
            )
        return answer

    # ---- the calls
    def send(self, ptr, count, datatype, peer, stream):
        self._p2p("send", ptr, count, datatype, peer, stream)

    def recv(self, ptr, count, datatype, peer, stream):
        self._p2p("recv", ptr, count, datatype, peer, stream)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        """One message to and one from every peer, in issue order with the others; summed on
        the stream once every part is in."""
        nbytes, npdt = _DTYPES[datatype]
        if npdt is None:
            raise TypeError("stand-in cannot reduce bf16")
        own = np.frombuffer(MPI.buffer.fromaddress(sendbuf, count * nbytes), dtype=npdt).copy()
        parts = {r: np.empty_like(own) for r in range(self.size) if r != self.rank}
        out = np.frombuffer(MPI.buffer.fromaddress(recvbuf, count * nbytes), dtype=npdt)
        for r, part in parts.items():
            self.nccl._add(self, ("recv", part, part.nbytes, r, stream))
            self.nccl._add(self, ("send", own, own.nbytes, r, stream))
        size = self.size

        def reduce():
            total = own + sum(parts.values()) if parts else own
            out[:] = total / size if op == NCCL_AVG else total

        self.nccl._add(self, ("then", reduce, 0, -1, stream))

    def check_async_error(self):
        if self.error is not None:
            raise self.error

    def abort(self):
        self.aborted = True

    def destroy(self):
        pass

    # ---- posting and completing
    def _p2p(self, kind, ptr, count, datatype, peer, stream):
        if not isinstance(ptr, int) or not isinstance(stream, int):
            raise TypeError("pointer and stream must be integers")
        if datatype not in _DTYPES:
            raise ValueError(f"bad datatype code {datatype}")
        if peer == self.rank or not 0 <= peer < self.size:
            raise ValueError(f"NCCL send/recv with peer {peer} (rank {self.rank} of {self.size})")
        self.nccl.calls.append((kind, count, datatype, peer, stream))
        self.nccl._add(self, (kind, ptr, count * _DTYPES[datatype][0], peer, stream))

    def post(self, kind, ptr, nbytes, peer):
        """Start one operation now; return what completes it on the stream (None: nothing)."""
        if kind == "then":
            return self._guard(ptr)
        if isinstance(ptr, int):
            buf = MPI.buffer.fromaddress(ptr, nbytes) if nbytes else bytearray()
        else:
            buf = ptr
        if kind == "recv":
            req = self.mpi.Irecv([buf, MPI.BYTE], source=peer, tag=_TAG)
        else:
            req = self.mpi.Isend([buf, MPI.BYTE], dest=peer, tag=_TAG)
        return self._guard(lambda: self._wait(req))

    def _wait(self, req) -> None:
        """Wait for ``req`` without spinning (MPI_Wait busy-polls: with more ranks than
        cores it takes the core a peer needs to post its half); ends on abort."""
        pause = 1e-5
        while not req.Test():
            if self.aborted:
                return
            time.sleep(pause)
            pause = min(1e-3, pause * 2)

    def _guard(self, finish):
        """``finish()`` on the stream, its error kept for ``check_async_error()``."""

        def run():
            if self.aborted or self.error is not None:
                return
            try:
                finish()
            except Exception as e:  # noqa: BLE001 - reported as NCCL reports async errors
                self.error = NcclError(f"rank {self.rank}: {e}")

        return run
