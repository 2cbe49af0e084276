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

NCCL has a type for most torch dtypes (:data:`NCCL_DTYPE`); a bool moves and
reduces as uint8 (as ``ProcessGroupNCCL`` does: a sum of bools is their
maximum, an or), an int16 moves as its raw bytes and cannot be reduced by
NCCL; any other dtype is refused by name before a group opens.

cupy 13's ``NcclCommunicator`` takes the unique id as a tuple of 128 signed
chars, cupy 14's as 128 bytes: :func:`new_communicator` hands each what it
takes.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from functools import partial
from typing import Sequence

import torch

from commrt.errors import CommError, CommTimeoutError
from commrt.transports import bounded
from commrt.transports import traits as engine
from commrt.transports.base import ON_A_CPU, Pair, Pending, Transport, poll_until
from commrt.transports.nccl_module import CupyNccl, NcclComm, NcclModule
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
#: torch dtypes NCCL has no type for, moved as uint8 (code 1): bool element by element (a
#: reduction of bools is one of uint8), int16 as its raw bytes (send and receive only)
AS_UINT8 = {torch.bool: 1, torch.int16: 2}  # dtype -> uint8 elements per element
NCCL_SUM, NCCL_MAX, NCCL_AVG = 0, 2, 4


#: what to install for the nccl backend (pyproject's extras), in every error that asks for it
INSTALL_HINT = (
    "\n  on a machine with an NVIDIA GPU: pip install 'commrt[cuda12]' (CUDA 12)"
    "\n    or 'commrt[cuda13]' (CUDA 13);"
    f"\n  {ON_A_CPU}."
)


def import_nccl() -> NcclModule:
    """``cupy.cuda.nccl`` (as a :class:`~commrt.transports.nccl_module.CupyNccl`), with an
    error that says what to install.

    cupy catches a missing libnccl itself and sets ``nccl.available = False``
    (the module then lacks ``get_unique_id``), so that is checked too.
    """
    try:
        nccl = importlib.import_module("cupy.cuda.nccl")
    except ImportError as e:  # the cause's own trace adds nothing: its text is kept
        raise RuntimeError(
            f"commrt: backend 'nccl' needs CuPy with NCCL:\n  {e};{INSTALL_HINT}"
        ) from None
    if not nccl.available:
        raise RuntimeError(
            f"commrt: backend 'nccl' needs NCCL:\n  CuPy could not load libnccl;{INSTALL_HINT}"
        )
    return CupyNccl(nccl)


def nccl_module(nccl: NcclModule | None) -> NcclModule:
    """``nccl``, or cupy's module where None (:func:`import_nccl`); anything else than an
    :class:`~commrt.transports.nccl_module.NcclModule` is a TypeError that says so."""
    nccl = nccl if nccl is not None else import_nccl()
    if not isinstance(nccl, NcclModule):
        raise TypeError(
            "nccl must be a commrt.transports.nccl_module.NcclModule (CupyNccl wraps "
            f"cupy.cuda.nccl), got {type(nccl).__name__}"
        )
    return nccl


def wire(t: torch.Tensor) -> tuple[int, int]:
    """(NCCL dtype code, count) that move ``t``: its own type where NCCL has one, else
    uint8 (:data:`AS_UINT8`); any other dtype is a ValueError that names it."""
    code = NCCL_DTYPE.get(t.dtype)
    if code is not None:
        return code, t.numel()
    per = AS_UINT8.get(t.dtype)
    if per is None:
        movable = sorted(map(str, [*NCCL_DTYPE, *AS_UINT8]))
        raise ValueError(f"NCCL cannot move {t.dtype}; supported: {movable}")
    return NCCL_DTYPE[torch.uint8], t.numel() * per


def reduction(t: torch.Tensor, op: str) -> tuple[int, int]:
    """(NCCL dtype code, NCCL op) of an all-reduce of ``t`` with ``op`` ("sum" or "avg"):
    bool as uint8, its sum a maximum (an or, as ProcessGroupNCCL has it); a dtype NCCL
    cannot add (int16, which it has no type for, or an average of bools) names itself."""
    if t.dtype == torch.bool and op == "sum":
        return NCCL_DTYPE[torch.uint8], NCCL_MAX
    code = NCCL_DTYPE.get(t.dtype)
    if code is None or t.dtype == torch.bool:
        raise ValueError(
            f"NCCL cannot {op} {t.dtype} tensors: it has no {t.dtype} type "
            f"(it reduces {sorted(map(str, NCCL_DTYPE))}, and bool sums)"
        )
    return code, NCCL_AVG if op == "avg" else NCCL_SUM


def _checked(pairs: Sequence[Pair]) -> list[tuple[int, int, int, int]]:
    """(pointer, count, dtype code, peer) per tensor, every one checked before a group
    opens: an error inside ``groupStart()``/``groupEnd()`` would leave a partial group."""
    out = []
    for t, peer in pairs:
        code, count = wire(t)
        if not t.is_contiguous():
            raise ValueError(f"NCCL moves contiguous tensors only; got strides {t.stride()}")
        out.append((t.data_ptr(), count, code, peer))
    return out


def new_communicator(nccl, world_size: int, uid: bytes, rank: int):
    """``nccl.NcclCommunicator(world_size, uid, rank)`` with the unique id as this cupy
    takes it: 128 bytes (cupy >= 14), or, where that is refused by type (cupy 13 declares
    ``tuple commId``), the tuple of 128 signed chars cupy 13's ``get_unique_id`` returns.
    The type is checked before NCCL is called, so the second try is the only one NCCL sees."""
    try:
        return nccl.NcclCommunicator(world_size, uid, rank)
    except TypeError as e:
        if "commId" not in str(e):
            raise
    signed = tuple(b - 256 if b > 127 else b for b in bytes(uid))
    return nccl.NcclCommunicator(world_size, signed, rank)


def _drop_group(nccl, comm, stream: int, abort) -> None:
    """Close a group in which a call failed, launching nothing of it: launching the calls
    before the failed one would send what the peers' groups do not expect. NCCL launches
    nothing of a group in which a call failed (``ncclGroupEnd`` returns that call's error
    and frees the group), but a call that failed before NCCL saw it (cupy's argument
    conversion) left no error there: an invalid send (peer -1) records one. ``groupEnd``
    then closes the group (the thread's group depth must not stay open for its next NCCL
    call), its error dropped: the caller reports the first one. Then ``abort()`` aborts
    the communicator, never before: an aborted communicator is freed, and the open
    group still refers to it."""
    try:
        comm.send(0, 0, NCCL_DTYPE[torch.uint8], -1, stream)
    except Exception:  # noqa: BLE001, S110 - the refusal is the point
        pass
    try:
        nccl.groupEnd()
    except Exception:  # noqa: BLE001, S110 - the first error is the one to report
        pass
    abort()


class _Group(Pending):
    """One group's completion, seen through an event recorded on the transport's stream.

    On a CUDA stream a receive is complete "in stream order": what the
    executor enqueues next on the same stream runs after it, so the host
    never waits here (``host_wait`` False), only checks NCCL's asynchronous
    error; a caller that must see the data on the host waits in
    :meth:`NcclTransport.sync`. On a host stream (the CPU stand-ins') the host
    waits for the event, unless the stand-in models a device stream
    (:attr:`NcclTransport.host_waits`).
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
    timeout or error **aborts** the communicator and marks the transport
    unusable (:attr:`broken`); ``close()`` then skips ``destroy()``, which
    would wait for the stuck operation. Abort and destroy can hang too: both
    are bounded (:mod:`commrt.transports.bounded`), and so is cupy's destroy
    at garbage collection. The calls that block in C code without a bound
    (creating the communicator; ``groupEnd()`` connecting a new pair;
    ``allReduce()``, which since NCCL 2.22 connects a new communicator's
    peers in its first collective) run under a
    :class:`~commrt.transports.watchdog.Watchdog` of ``timeout`` seconds (a
    barrier's own timeout for a barrier).
    """

    name = "nccl"
    traits = engine.NCCL
    #: the NCCL communicator: None until made (also where __init__ failed before, which
    #: __del__ still sees) and after close
    comm: NcclComm | None = None

    def __init__(
        self,
        rank: int,
        world_size: int,
        unique_id,
        device: torch.device,
        *,
        nccl=None,
        timeout: float,
    ):
        super().__init__(rank, world_size, device)
        self.nccl = nccl_module(nccl)
        self.timeout = float(timeout)
        #: why the transport can no longer be used (None while it can)
        self.broken: str | None = None
        #: seconds an abort, and a healthy close's destroy, may take (module bounded)
        self.abort_s, self.destroy_s = bounded.ABORT_S, bounded.DESTROY_S
        #: whether a group's waits wait on the host: not on a CUDA stream, nor on a stand-in
        #: stream that completes as one does (``device_streams``: the caller must host-wait
        #: in sync() where it reads the data)
        on_cuda = device.type == "cuda"
        self.host_waits = not on_cuda and not self.nccl.device_streams
        #: the one completion of every group where the host never waits for one (no event)
        self._in_order = None if self.host_waits else _Group(self, None, host_wait=False)
        if on_cuda:
            torch.cuda.set_device(device)
        # a torch.cuda.Stream; on a CPU, None but for a stand-in that models streams
        self._stream = torch.cuda.Stream(device) if on_cuda else self.nccl.HostStream()
        self.watchdog = Watchdog()
        what = f"rank {rank}: creating the NCCL communicator ({world_size} ranks)"
        with self.watchdog.guard(self.timeout, None, what):  # nothing to abort: ends the process
            self.comm = new_communicator(self.nccl, world_size, unique_id, rank)

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
        """Mark the transport unusable and abort the communicator, waiting at most
        :attr:`abort_s` for the abort (it goes on alone after that)."""
        if self.broken is not None:
            return  # aborted already
        self.broken = reason
        comm = self.comm
        if comm is None:
            return
        if not bounded.call_bounded(comm.abort, self.abort_s, "nccl-abort"):
            bounded.keep_forever(comm)  # its __dealloc__ would destroy it: never collect it
            bounded.warn(
                f"rank {self.rank}: ncclCommAbort did not return within {self.abort_s:g} s "
                f"({reason}); going on without it"
            )

    def _guarded(self, call, name: str, timeout: float, peers: list[int]) -> None:
        """``call()``, NCCL's ``name`` (``groupEnd``, or an ``allReduce`` that may connect),
        under the watchdog: at ``timeout`` it aborts and the named CommTimeoutError is
        raised; NCCL's own error aborts and is raised as a CommError."""
        what = f"rank {self.rank}: {name} (connecting to ranks {peers})"
        with self.watchdog.guard(timeout, lambda: self.abort(f"{name} timed out"), what) as dog:
            try:
                call()
            except Exception as e:
                if not dog.fired:
                    self.abort(f"{name} failed: {e}")
                    raise CommError(f"commrt: rank {self.rank}: NCCL failed: {e}") from e
        if dog.fired:
            raise CommTimeoutError(
                rank=self.rank,
                peer=peers[0] if len(peers) == 1 else None,
                what=f"NCCL connection setup in {name} (peers {peers})",
                timeout_s=timeout,
            )

    def check_error(self) -> None:
        """Raise (after aborting) an asynchronous NCCL error: a peer's network failure shows
        as a named error at once, not as a timeout minutes later."""
        if self.comm is None:
            return
        try:
            self.comm.check_async_error()
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
        nccl.groupStart()
        try:
            for ptr, count, code, peer in send_args:
                comm.send(ptr, count, code, peer, s)
            for ptr, count, code, peer in recv_args:
                comm.recv(ptr, count, code, peer, s)
        except BaseException as e:
            _drop_group(nccl, comm, s, partial(self.abort, f"a call of a group failed: {e!r}"))
            if isinstance(e, Exception):  # an interrupt stays what it is
                raise CommError(f"commrt: rank {self.rank}: NCCL refused a call: {e}") from e
            raise
        self._guarded(nccl.groupEnd, "groupEnd", self.timeout, peers)
        return self._in_order or _Group(self, self._record(), host_wait=True)

    def stream(self):
        on_cuda = self.device.type == "cuda"
        return torch.cuda.stream(self._stream) if on_cuda else contextlib.nullcontext()

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

    def _all_reduce(self, t: torch.Tensor, op: str, timeout: float) -> None:
        """Enqueue NCCL's all-reduce of ``t`` in place, under the watchdog: since NCCL 2.22
        a communicator connects its peers lazily, inside its first collective's call, which
        then blocks in C code until every rank has come."""
        self._usable()
        code, nccl_op = reduction(t, op)
        self.begin(t)
        ptr, s = t.data_ptr(), self._stream_ptr()
        others = [r for r in range(self.world_size) if r != self.rank]

        def call():
            self.comm.allReduce(ptr, ptr, t.numel(), code, nccl_op, s)

        self._guarded(call, "allReduce", timeout, others)

    def barrier(self, timeout: float) -> bool:
        """An all-reduce of one element, waited for; False (the communicator aborted) if it
        did not finish, or could not even start, within ``timeout``."""
        deadline = time.monotonic() + timeout
        one = torch.ones(1, device=self.device)  # held until the stream has passed it
        try:
            self._all_reduce(one, "sum", timeout)
        except CommTimeoutError:
            return False
        return self.sync(deadline)

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self._all_reduce(tensor, op, self.timeout)
        if self.device.type != "cuda" and not self.sync(time.monotonic() + self.timeout):
            raise CommTimeoutError(
                rank=self.rank, peer=None, what="native all-reduce", timeout_s=self.timeout
            )
        self.end(tensor)

    def close(self) -> None:
        """Destroy the communicator once its work is done (waiting :attr:`destroy_s` at
        most: destroy waits for the other ranks); abort it instead when the transport failed
        or the work does not finish within the timeout (destroy would wait for it forever)."""
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
        if self.broken is None:
            if not bounded.call_bounded(comm.destroy, self.destroy_s, "nccl-destroy"):
                bounded.keep_forever(comm)
                bounded.warn(
                    f"rank {self.rank}: ncclCommDestroy did not return within "
                    f"{self.destroy_s:g} s (another rank has not closed); going on without it"
                )

    def __del__(self) -> None:
        """Dropped without close(): destroy the communicator on a thread of its own rather
        than let cupy's ``__dealloc__`` destroy it, without a bound, in this collection."""
        comm = self.comm
        if comm is None or self.broken is not None:
            return  # closed, or aborted (an aborted communicator has nothing left to destroy)
        self.comm = None
        bounded.keep_forever(comm)  # the thread may never end: nothing may collect it
        bounded.call_bounded(comm.destroy, 0.0, "nccl-destroy")
