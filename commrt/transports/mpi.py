"""MPI transport: mpi4py Isend/Irecv straight on the tensors' memory.

Buffers are handed to MPI as raw bytes at the tensor's address (no copies,
any dtype, bf16 included); reductions happen in commrt, not in MPI.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from commrt.transports import traits as engine
from commrt.transports.base import Pair, Pending, Prepared, Transport, average_first, poll_until


def load_mpi():
    """mpi4py's ``MPI`` module, or a RuntimeError that says what to install.

    Imported on first use: importing ``mpi4py.MPI`` initialises MPI, which a
    gloo- or nccl-only job should not pay for (or need installed)."""
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "the mpi backend needs mpi4py and an MPI library: "
            "pip install 'commrt[mpi]' (mpi4py + the mpich wheel)"
        ) from e
    return MPI


def as_buffer(t: torch.Tensor, MPI):
    """An MPI byte buffer over a contiguous CPU tensor's memory (no copy)."""
    nbytes = t.numel() * t.element_size()
    return [MPI.buffer.fromaddress(t.data_ptr(), nbytes) if nbytes else bytearray(), MPI.BYTE]


class _MpiPending(Pending):
    __slots__ = ("sreqs", "rreqs", "stests", "rtests", "spin_s", "check")

    def __init__(self, sreqs, rreqs, spin_s: float = 0.0, check=None):
        self.sreqs, self.rreqs, self.spin_s, self.check = sreqs, rreqs, spin_s, check
        # bound once: an 8-byte all-reduce is a few microseconds, and a request already
        # complete (an eager send) then costs one call, not a bound method and a poll loop
        self.stests = [r.Test for r in sreqs]
        self.rtests = [r.Test for r in rreqs]

    def wait_recv(self, i: int, deadline: float) -> bool:
        test = self.rtests[i]
        return test() or poll_until(test, deadline, self.spin_s, self.check)

    def wait_send(self, i: int, deadline: float) -> bool:
        test = self.stests[i]
        return test() or poll_until(test, deadline, self.spin_s, self.check)

    def cancel(self) -> None:
        for r in self.rreqs + self.sreqs:
            try:
                if not r.Test():
                    r.Cancel()
                    r.Wait()
            except Exception:  # MPI finalized, or the request already freed
                pass


class _MpiPrepared(Prepared):
    """Persistent requests (MPI_Send_init/Recv_init): a repeated step is one
    Startall instead of building buffers and requests per message."""

    __slots__ = ("pending", "preqs", "_startall")

    def __init__(self, transport, sends, recvs, tag):
        super().__init__(transport, sends, recvs, tag)
        comm, MPI = transport.comm, transport.MPI
        tag %= transport.tag_ub
        rreqs = [comm.Recv_init(as_buffer(t, MPI), source=peer, tag=tag) for t, peer in recvs]
        sreqs = [comm.Send_init(as_buffer(t, MPI), dest=peer, tag=tag) for t, peer in sends]
        # the check is the communicator's watch, attached before any step is prepared
        self.pending = _MpiPending(sreqs, rreqs, check=transport.waiting_check())
        self.preqs = rreqs + sreqs  # receives start first
        self._startall = MPI.Prequest.Startall

    def start(self, spin_s: float = 0.0) -> Pending:
        self._startall(self.preqs)
        pending = self.pending
        pending.spin_s = spin_s
        return pending

    def free(self) -> None:
        for r in self.preqs:
            try:
                r.Free()
            except Exception:  # MPI already finalized, or still active after a timeout
                pass
        self.preqs = []


class MpiTransport(Transport):
    """Point-to-point over a private duplicate of an MPI communicator."""

    name = "mpi"
    traits = engine.MPI

    def __init__(self, comm=None):
        MPI = load_mpi()
        base = comm if comm is not None else MPI.COMM_WORLD
        # A private communicator: commrt's messages never match the user's.
        self.comm = base.Dup()
        super().__init__(self.comm.Get_rank(), self.comm.Get_size(), torch.device("cpu"))
        self.tag_ub = int(self.comm.Get_attr(MPI.TAG_UB) or 32767)
        self.MPI = MPI

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        tag %= self.tag_ub
        comm, MPI = self.comm, self.MPI
        # Receives first, so the matching sends find them posted.
        rreqs = [comm.Irecv(as_buffer(t, MPI), source=peer, tag=tag) for t, peer in recvs]
        sreqs = [comm.Isend(as_buffer(t, MPI), dest=peer, tag=tag) for t, peer in sends]
        return _MpiPending(sreqs, rreqs, check=self.waiting_check())

    def prepare(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Prepared:
        return _MpiPrepared(self, sends, recvs, tag)

    def barrier(self, timeout: float) -> bool:
        req = self.comm.Ibarrier()
        return poll_until(req.Test, time.monotonic() + timeout, check=self.waiting_check())

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        MPI = load_mpi()
        if tensor.dtype in (torch.bfloat16,):
            raise TypeError("MPI has no bfloat16 reduction; reduce a float32 copy instead")
        average_first(tensor, op, self.world_size)  # the rule: scaled before the sum
        self.comm.Allreduce(MPI.IN_PLACE, tensor.numpy(), op=MPI.SUM)

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            try:
                comm.Free()
            except Exception:  # MPI already finalized at interpreter exit
                pass
