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

from commrt.errors import CommError, CommTimeoutError
from commrt.transports.base import Pair, Pending, Transport, poll_until
from commrt.transports.watchdog import Watchdog

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


class _Group(Pending):
    """One group's completion, seen through an event recorded on the transport's stream.

    On a CUDA stream a receive is complete "in stream order": what the
    executor enqueues next on the same stream runs after it, so the host
    never waits here (``host_wait`` False), only checks NCCL's asynchronous
    error. On a host stream (the CPU stand-in's) the host waits for the event.
    """

    def __init__(self, transport: "NcclTransport", event, host_wait: bool):
        self.transport, self.event, self.host_wait = transport, event, host_wait

    def _wait(self, deadline: float) -> bool:
        if not self.host_wait:
            self.transport.check_error()
            return True
        return self.transport.wait_event(self.event, deadline)

    def wait_recv(self, i: int, deadline: float) -> bool:
        return self._wait(deadline)

    def wait_send(self, i: int, deadline: float) -> bool:
        return self._wait(deadline)


class NcclTransport(Transport):
    """One ``NcclCommunicator`` per process, operations on a private stream.

    NCCL cannot cancel an operation: after a timeout or an error the kernel
    may still wait for its peer and write into the buffers later. So any
    timeout or error **aborts** the communicator (``abort()``, which never
    waits) and marks the transport unusable (:attr:`broken`); ``close()``
    then skips ``destroy()``, which would wait for the stuck operation.
    The calls that block in C code without a bound (creating the
    communicator, ``groupEnd()`` connecting a new pair) run under a
    :class:`~commrt.transports.watchdog.Watchdog` of ``timeout`` seconds.
    """

    name = "nccl"
    stream_ordered = True
    # a wait that passes its deadline aborts the communicator (nothing can be cancelled), so
    # a caller must never cut a long wait into short ones: a 0.25 s slice of a catch-up
    # receive whose server sent a little later aborted it
    waits_break_on_timeout = True

    def __init__(
        self,
        rank: int,
        world_size: int,
        unique_id,
        device: torch.device,
        *,
        nccl=None,
        timeout: float = 300.0,
    ):
        super().__init__(rank, world_size, device)
        self.nccl = nccl if nccl is not None else import_nccl()
        self.timeout = float(timeout)
        #: why the transport can no longer be used (None while it can)
        self.broken: str | None = None
        self.comm = None
        self._stream = None  # a torch.cuda.Stream, or the CPU stand-in's host stream
        if device.type == "cuda":
            torch.cuda.set_device(device)
            self._stream = torch.cuda.Stream(device)
        elif hasattr(self.nccl, "HostStream"):  # a CPU stand-in that models streams
            self._stream = self.nccl.HostStream()
        self.watchdog = Watchdog()
        what = f"rank {rank}: creating the NCCL communicator ({world_size} ranks)"
        with self.watchdog.watch(self.timeout, None, what):  # nothing to abort: ends the process
            self.comm = self.nccl.NcclCommunicator(world_size, unique_id, rank)

    def _stream_ptr(self) -> int:
        if self._stream is None:
            return 0
        return self._stream.cuda_stream if self.device.type == "cuda" else self._stream.ptr

    def _record(self):
        """An event after everything enqueued on the stream so far (None without a stream)."""
        if self._stream is None:
            return None
        if self.device.type != "cuda":
            return self._stream.record()
        ev = torch.cuda.Event()
        ev.record(self._stream)
        return ev

    # ---- failures: abort, never wait on a stuck operation
    def abort(self, reason: str) -> None:
        """Abort the communicator (never waits) and mark the transport unusable."""
        if self.broken is not None:
            return  # aborted already
        self.broken = reason
        comm = self.comm
        if comm is not None and hasattr(comm, "abort"):
            comm.abort()

    def _abort_group(self) -> None:
        self.abort("groupEnd timed out")

    def check_error(self) -> None:
        """Raise (after aborting) an asynchronous NCCL error: a peer's network failure shows
        as a named error at once, not as a timeout minutes later."""
        check = getattr(self.comm, "check_async_error", None)
        if check is None:
            return
        try:
            check()
        except Exception as e:  # cupy's NcclError, or the stand-in's
            self.abort(f"NCCL reported {e}")
            raise CommError(f"commrt: rank {self.rank}: NCCL failed: {e}") from e

    def wait_event(self, event, deadline: float) -> bool:
        """Wait, bounded, for ``event``; poll NCCL's async error meanwhile; abort at the
        deadline (the operations behind the event can no longer be cancelled)."""
        if event is None:
            return True

        def done() -> bool:
            # aborted meanwhile (by another thread: a wait given up on): end now, without
            # asking an aborted communicator anything
            self._usable()
            self.check_error()
            return event.query()

        if poll_until(done, deadline):
            return True
        self.abort(f"an operation did not finish within {self.timeout:g} s")
        return False

    def _usable(self) -> None:
        if self.broken is not None:
            raise CommError(
                f"commrt: rank {self.rank}: the NCCL transport is unusable ({self.broken}); "
                "NCCL cannot cancel operations, so the communicator was aborted: make a new one"
            )

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        self._usable()
        nccl, comm, s = self.nccl, self.comm, self._stream_ptr()
        send_args, recv_args = _checked(sends), _checked(recvs)
        peers = sorted({a[3] for a in send_args + recv_args})
        what = f"rank {self.rank}: groupEnd (connecting to ranks {peers})"
        nccl.groupStart()
        try:
            for ptr, count, code, peer in send_args:
                comm.send(ptr, count, code, peer, s)
            for ptr, count, code, peer in recv_args:
                comm.recv(ptr, count, code, peer, s)
        finally:
            with self.watchdog.watch(self.timeout, self._abort_group, what) as dog:
                try:
                    nccl.groupEnd()
                except Exception as e:
                    if not dog.fired:
                        self.abort(f"groupEnd failed: {e}")
                        raise CommError(f"commrt: rank {self.rank}: NCCL failed: {e}") from e
            if dog.fired:
                raise CommTimeoutError(
                    rank=self.rank,
                    peer=peers[0] if len(peers) == 1 else None,
                    what=f"NCCL connection setup in groupEnd (peers {peers})",
                    timeout_s=self.timeout,
                )
        return _Group(self, self._record(), host_wait=self.device.type != "cuda")

    def stream(self):
        return (
            torch.cuda.stream(self._stream)
            if self.device.type == "cuda"
            else contextlib.nullcontext()
        )

    def begin(self, tensor: torch.Tensor) -> None:
        if self.device.type == "cuda":
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            tensor.record_stream(self._stream)

    def end(self, tensor: torch.Tensor) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).wait_stream(self._stream)

    def sync(self, deadline: float) -> bool:
        """Host-wait, bounded, until everything enqueued so far has run."""
        self._usable()
        return self.wait_event(self._record(), deadline)

    def barrier(self, timeout: float) -> bool:
        self._usable()
        one = torch.ones(1, device=self.device)
        self.begin(one)
        self.comm.allReduce(
            one.data_ptr(), one.data_ptr(), 1, NCCL_DTYPE[one.dtype], NCCL_SUM, self._stream_ptr()
        )
        return self.sync(time.monotonic() + timeout)

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self._usable()
        self.begin(tensor)
        self.comm.allReduce(
            tensor.data_ptr(),
            tensor.data_ptr(),
            tensor.numel(),
            _dtype_code(tensor),
            NCCL_AVG if op == "avg" else NCCL_SUM,
            self._stream_ptr(),
        )
        if self.device.type != "cuda" and not self.sync(time.monotonic() + self.timeout):
            raise CommTimeoutError(
                rank=self.rank, peer=None, what="native all-reduce", timeout_s=self.timeout
            )
        self.end(tensor)

    def close(self) -> None:
        """Destroy the communicator once its work is done; abort it instead when the
        transport failed or the work does not finish within the timeout (``destroy()``
        would wait for it forever)."""
        comm = self.comm
        if comm is None:
            return
        if self.broken is None:
            try:
                if not self.sync(time.monotonic() + self.timeout):
                    self.abort("close: pending operations did not finish")
            except CommError:
                pass  # aborted by check_error
        self.comm = None
        if self.broken is None and hasattr(comm, "destroy"):
            comm.destroy()
