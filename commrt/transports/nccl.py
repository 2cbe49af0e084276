"""NCCL transport over ``cupy.cuda.nccl``, kept deliberately thin.

Everything here is a pointer, a count, a dtype code, a peer and a stream
pointer, so the part that only a GPU can run is small. The ``nccl`` module
is a parameter: on a GPU it is ``cupy.cuda.nccl``; tests here hand in a
stand-in with the same signatures that moves host bytes over MPI, which
checks this adapter (grouping, pointers, counts, dtype codes) but not NCCL
or CUDA streams.

All operations run on one dedicated CUDA stream, ordered after the caller's
stream by an event (:meth:`NcclTransport.begin`) and before the caller's
later work by another (:meth:`NcclTransport.end`).
"""

from __future__ import annotations

import contextlib
import importlib
import time
from typing import Sequence

import torch

from commrt.transports.base import Pair, Pending, Transport, poll_until

#: ncclDataType_t codes (nccl.h); bf16 is 9.
NCCL_DTYPE = {
    torch.int8: 0,
    torch.uint8: 1,
    torch.int32: 2,
    torch.int64: 4,
    torch.float16: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.bfloat16: 9,
}
NCCL_SUM, NCCL_AVG = 0, 4


#: what to install for the nccl backend (pyproject's extras), in every error that asks for it
INSTALL_HINT = (
    "pip install 'commrt[cuda12]' (CUDA 12) or 'commrt[cuda13]' (CUDA 13) on a machine "
    "with an NVIDIA GPU; on a CPU use backend='mpi' or 'gloo'"
)


def import_nccl():
    """``cupy.cuda.nccl``, with an error that says what to install.

    cupy catches a missing libnccl itself and sets ``nccl.available = False``
    (the module then lacks ``get_unique_id``), so that is checked too.
    """
    try:
        nccl = importlib.import_module("cupy.cuda.nccl")
    except ImportError as e:
        raise RuntimeError(f"the nccl backend needs CuPy with NCCL: {INSTALL_HINT}") from e
    if not getattr(nccl, "available", True):
        raise RuntimeError(
            f"the nccl backend needs NCCL, and CuPy could not load libnccl: {INSTALL_HINT}"
        )
    return nccl


def nccl_missing() -> str | None:
    """None if :func:`import_nccl` works here, else what is missing and what to install."""
    try:
        import_nccl()
    except RuntimeError as e:
        return str(e)
    return None


def _dtype_code(t: torch.Tensor) -> int:
    try:
        return NCCL_DTYPE[t.dtype]
    except KeyError:
        raise ValueError(
            f"NCCL cannot move {t.dtype}; supported: {sorted(map(str, NCCL_DTYPE))}"
        ) from None


def _checked(pairs: Sequence[Pair]) -> list[tuple[int, int, int, int]]:
    """(pointer, count, dtype code, peer) per tensor, every one checked before a group
    opens: an error inside ``groupStart()``/``groupEnd()`` would leave a partial group."""
    out = []
    for t, peer in pairs:
        code = _dtype_code(t)
        if not t.is_contiguous():
            raise ValueError(f"NCCL moves contiguous tensors only; got strides {t.stride()}")
        out.append((t.data_ptr(), t.numel(), code, peer))
    return out


class _StreamOrdered(Pending):
    # Receives are complete "in stream order": whatever the executor enqueues
    # next on the same stream runs after them, so the host never waits here.
    def wait_recv(self, i: int, deadline: float) -> bool:
        return True

    def wait_send(self, i: int, deadline: float) -> bool:
        return True


class NcclTransport(Transport):
    """One ``NcclCommunicator`` per process, operations on a private stream."""

    name = "nccl"
    stream_ordered = True

    def __init__(self, rank: int, world_size: int, unique_id, device: torch.device, *, nccl=None):
        super().__init__(rank, world_size, device)
        self.nccl = nccl if nccl is not None else import_nccl()
        self._stream = None
        if device.type == "cuda":
            torch.cuda.set_device(device)
            self._stream = torch.cuda.Stream(device)
        self.comm = self.nccl.NcclCommunicator(world_size, unique_id, rank)

    def _stream_ptr(self) -> int:
        return self._stream.cuda_stream if self._stream is not None else 0

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        nccl, comm, s = self.nccl, self.comm, self._stream_ptr()
        send_args, recv_args = _checked(sends), _checked(recvs)
        nccl.groupStart()
        try:
            for ptr, count, code, peer in send_args:
                comm.send(ptr, count, code, peer, s)
            for ptr, count, code, peer in recv_args:
                comm.recv(ptr, count, code, peer, s)
        finally:
            nccl.groupEnd()
        return _StreamOrdered()

    def stream(self):
        return (
            torch.cuda.stream(self._stream)
            if self._stream is not None
            else contextlib.nullcontext()
        )

    def begin(self, tensor: torch.Tensor) -> None:
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            tensor.record_stream(self._stream)

    def end(self, tensor: torch.Tensor) -> None:
        if self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)

    def sync(self, deadline: float) -> bool:
        """Host-wait, bounded, until everything enqueued so far has run."""
        if self._stream is None:
            return True
        ev = torch.cuda.Event()
        ev.record(self._stream)
        return poll_until(ev.query, deadline)

    def barrier(self, timeout: float) -> bool:
        one = torch.ones(1, device=self.device)
        self.begin(one)
        self.comm.allReduce(
            one.data_ptr(), one.data_ptr(), 1, NCCL_DTYPE[one.dtype], NCCL_SUM, self._stream_ptr()
        )
        return self.sync(time.monotonic() + timeout)

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self.begin(tensor)
        self.comm.allReduce(
            tensor.data_ptr(),
            tensor.data_ptr(),
            tensor.numel(),
            _dtype_code(tensor),
            NCCL_AVG if op == "avg" else NCCL_SUM,
            self._stream_ptr(),
        )
        self.end(tensor)

    def close(self) -> None:
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None and hasattr(comm, "destroy"):
            comm.destroy()
