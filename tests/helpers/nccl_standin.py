"""A stand-in for ``cupy.cuda.nccl`` that moves host bytes over MPI.

Same call signatures as cupy >= 14 (``get_unique_id()``, module-level
``groupStart()``/``groupEnd()``, ``NcclCommunicator(ndev, commId, rank)``
with ``send/recv(ptr, count, datatype, peer, stream)`` and
``allReduce(sendbuf, recvbuf, count, datatype, op, stream)``). Inside a
group, sends and receives are buffered and only move at ``groupEnd()``, as
NCCL's are. Byte counts come from the dtype code through this file's own
table, so a wrong code or count in the adapter corrupts data or fails loudly.

This checks commrt's NCCL adapter (grouping, pointers, counts, dtype codes,
unique-id rendezvous). It says nothing about NCCL, CUDA streams or GPUs.
It is lenient where NCCL hangs (a new pair's connection, mismatched counts,
asynchronous completion): tests/helpers/nccl_strict.py models those rules.
"""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

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


class StandInNccl:
    """Module-like object: pass it as ``commrt.init(..., nccl_module=StandInNccl())``."""

    def __init__(self, mpi_comm=None):
        self.mpi = (mpi_comm or MPI.COMM_WORLD).Dup()
        self._depth = 0
        self._queued: list = []
        self.calls: list[tuple] = []  # (op, count, dtype code, peer, stream) for tests to inspect
        outer = self

        class NcclCommunicator:
            def __init__(self, ndev, commId, rank):
                if not isinstance(commId, bytes):  # what cupy 14 raises (seen on an H100 box)
                    raise TypeError(
                        f"Argument 'commId' has incorrect type (expected bytes, got "
                        f"{type(commId).__name__})"
                    )
                if len(commId) != 128:
                    raise ValueError(f"ncclUniqueId must be 128 bytes, got {len(commId)}")
                ids = outer.mpi.allgather(tuple(commId))
                if any(i != ids[0] for i in ids):
                    raise RuntimeError("ranks were given different unique ids")
                if ndev != outer.mpi.Get_size() or rank != outer.mpi.Get_rank():
                    raise RuntimeError(f"rank {rank} of {ndev} does not match MPI")
                self.rank, self.size = rank, ndev

            def send(self, ptr, count, datatype, peer, stream):
                outer._p2p("send", ptr, count, datatype, peer, stream)

            def recv(self, ptr, count, datatype, peer, stream):
                outer._p2p("recv", ptr, count, datatype, peer, stream)

            def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
                nbytes, npdt = _DTYPES[datatype]
                if npdt is None:
                    raise TypeError("stand-in cannot reduce bf16")
                a = np.frombuffer(
                    MPI.buffer.fromaddress(sendbuf, count * nbytes), dtype=npdt
                ).copy()
                out = np.frombuffer(MPI.buffer.fromaddress(recvbuf, count * nbytes), dtype=npdt)
                outer.mpi.Allreduce(a, out, op=MPI.SUM)
                if op == NCCL_AVG:
                    out /= outer.mpi.Get_size()

            def destroy(self):
                pass

        self.NcclCommunicator = NcclCommunicator

    @property
    def depth(self) -> int:
        """How many ``groupStart()`` calls are still open (0 outside a group)."""
        return self._depth

    def get_unique_id(self):
        return os.urandom(128)  # cupy >= 14: 128 bytes

    def groupStart(self):
        self._depth += 1

    def groupEnd(self):
        if self._depth == 0:
            raise RuntimeError("groupEnd without groupStart")
        self._depth -= 1
        if self._depth == 0:
            self._flush()

    def _p2p(self, kind, ptr, count, datatype, peer, stream):
        if not isinstance(ptr, int) or not isinstance(stream, int):
            raise TypeError("pointer and stream must be integers")
        if datatype not in _DTYPES:
            raise ValueError(f"bad datatype code {datatype}")
        if peer == self.mpi.Get_rank():
            raise ValueError("NCCL send/recv to self")
        self.calls.append((kind, count, datatype, peer, stream))
        self._queued.append((kind, ptr, count * _DTYPES[datatype][0], peer))
        if self._depth == 0:
            self._flush()

    def _flush(self):
        queued, self._queued = self._queued, []
        reqs = []
        for kind, ptr, nbytes, peer in queued:  # receives first, then sends
            if kind == "recv":
                reqs.append(
                    self.mpi.Irecv(
                        [MPI.buffer.fromaddress(ptr, nbytes) if nbytes else bytearray(), MPI.BYTE],
                        source=peer,
                    )
                )
        for kind, ptr, nbytes, peer in queued:
            if kind == "send":
                reqs.append(
                    self.mpi.Isend(
                        [MPI.buffer.fromaddress(ptr, nbytes) if nbytes else bytearray(), MPI.BYTE],
                        dest=peer,
                    )
                )
        MPI.Request.Waitall(reqs)
