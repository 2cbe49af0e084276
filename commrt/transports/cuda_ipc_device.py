"""The device the ``cuda_ipc`` transport drives: memory, streams and events shared by processes.

:class:`IpcDevice` declares every device operation the transport uses, and
nothing else: allocate and free a slab, export and open a slab's
interprocess handle, copy bytes on a stream, create, export and open an
interprocess event, record it, make a stream wait for it, query it. The
transport's control logic (slots, sequence numbers, which event is waited
for when, a peer's death, timeouts) lives in
:mod:`commrt.transports.cuda_ipc` and only ever calls these operations, so
it runs unchanged on a real GPU (:class:`CudaDevice`) and on a strict CPU
stand-in whose streams complete later on worker threads (the tests' device).

Memory is named by integer addresses ("pointers") in the calling process:
a slab this process allocated, a peer's slab it opened, or a tensor's
``data_ptr()``. Handles are bytes, so they travel through the job's store.

:class:`CudaDevice` is kept as thin as the NCCL transport: each operation
is one call of ``cupy.cuda.runtime`` (public, unlike torch's
``_share_cuda_``), with the stream a ``torch.cuda.Stream`` so that the
executor's reductions, enqueued inside :meth:`IpcDevice.stream_context`,
run on the same stream as the copies.
"""

from __future__ import annotations

import abc
import contextlib
import importlib

import torch

#: cudaEventDisableTiming | cudaEventInterprocess: the only flags an exported event may have
EVENT_FLAGS = 0x2 | 0x4
#: cudaMemcpyDeviceToDevice (also between a peer's opened memory and ours)
COPY_D2D = 3
#: cudaMemcpyDefault: the direction from the pointers (host memory, pinned or not)
COPY_ANY = 4
#: cudaDevAttrIpcEventSupport: whether the device can share events between processes
ATTR_IPC_EVENTS = 125
#: cudaErrorNotReady, what cudaEventQuery returns while the recorded work runs
NOT_READY = 600


class IpcDevice(abc.ABC):
    """Every operation the ``cuda_ipc`` transport asks of a device (one per method).

    Ordering follows CUDA's rules, which the CPU stand-in keeps strictly:
    work on one stream runs in issue order and later than it was issued;
    :meth:`wait_event` makes a stream wait for the most recent
    :meth:`record` of that event issued *before* the wait (none: no wait);
    an event recorded in one process can be waited for in another once the
    handle is opened there. Nothing here blocks the host except
    :meth:`query`'s caller polling it.
    """

    #: what the transport's tensors live on ("cuda", or "cpu" for the stand-in)
    device: torch.device

    @abc.abstractmethod
    def unusable(self) -> str | None:
        """Why this process cannot share device memory and events (None: it can)."""

    @abc.abstractmethod
    def identity(self) -> str:
        """Which physical device this is, the same text in every process that drives it."""

    @abc.abstractmethod
    def can_reach(self, peer_identity: str) -> bool:
        """Whether this device can read and write memory of the device ``peer_identity``
        names (the same device, or a peer with peer access)."""

    # -- memory
    @abc.abstractmethod
    def allocate(self, nbytes: int) -> int:
        """A new slab of ``nbytes`` device bytes, an allocation of its own (so its
        handle names exactly it); its address."""

    @abc.abstractmethod
    def free(self, ptr: int) -> None:
        """Free a slab :meth:`allocate` returned."""

    @abc.abstractmethod
    def export_memory(self, ptr: int) -> bytes:
        """The interprocess handle of the slab at ``ptr``."""

    @abc.abstractmethod
    def open_memory(self, handle: bytes) -> int:
        """A peer's slab, mapped into this process; its address here."""

    @abc.abstractmethod
    def close_memory(self, ptr: int) -> None:
        """Unmap a peer's slab :meth:`open_memory` mapped."""

    # -- streams
    @abc.abstractmethod
    def new_stream(self):
        """A stream of this device's own (not the caller's current one)."""

    @abc.abstractmethod
    def stream_context(self, stream) -> contextlib.AbstractContextManager:
        """Context in which torch work (the executor's reductions) goes on ``stream``."""

    @abc.abstractmethod
    def copy(self, dst: int, src: int, nbytes: int, stream) -> None:
        """Enqueue a copy of ``nbytes`` from ``src`` to ``dst`` on ``stream``."""

    @abc.abstractmethod
    def host_copy(self, dst: int, src: int, nbytes: int, stream) -> None:
        """Enqueue a copy of ``nbytes`` on ``stream`` between this device's memory and host
        memory (either side; pinned by :meth:`pin` or not)."""

    @abc.abstractmethod
    def pin(self, ptr: int, nbytes: int) -> None:
        """Page-lock ``nbytes`` of host memory at ``ptr`` for :meth:`host_copy` (a
        RuntimeError where the system refuses)."""

    @abc.abstractmethod
    def unpin(self, ptr: int) -> None:
        """Undo :meth:`pin` of the memory at ``ptr``."""

    @abc.abstractmethod
    def sum_into(self, dst: int, srcs: list[int], count: int, dtype: torch.dtype, stream) -> None:
        """Enqueue on ``stream``: ``dst`` = the sum of the ``count`` elements of ``dtype`` at
        each of ``srcs``, added in the order given (fp16 and bf16 in fp32, rounded once),
        so every process that sums the same sources in the same order gets the same bits.
        ``dst`` may be one of ``srcs``."""

    @abc.abstractmethod
    def host_func(self, stream, fn) -> None:
        """Enqueue ``fn()`` on ``stream``: it runs on the host once the work before it has
        run (``cudaLaunchHostFunc``); ``fn`` must not call the device."""

    @abc.abstractmethod
    def after_caller(self, stream, tensor: torch.Tensor) -> None:
        """Order ``stream``'s later work after the caller's writes to ``tensor``."""

    @abc.abstractmethod
    def caller_after(self, stream) -> None:
        """Order the caller's later work after everything enqueued on ``stream``."""

    # -- events
    @abc.abstractmethod
    def create_event(self):
        """A new interprocess event (no timing)."""

    @abc.abstractmethod
    def export_event(self, event) -> bytes:
        """The interprocess handle of an event :meth:`create_event` made."""

    @abc.abstractmethod
    def open_event(self, handle: bytes):
        """A peer's event, opened in this process."""

    @abc.abstractmethod
    def destroy_event(self, event) -> None:
        """Release an event (made or opened here)."""

    @abc.abstractmethod
    def record(self, event, stream) -> None:
        """Enqueue a record of ``event`` on ``stream``."""

    @abc.abstractmethod
    def wait_event(self, stream, event) -> None:
        """Make ``stream``'s later work wait for the last record of ``event`` issued so far."""

    @abc.abstractmethod
    def query(self, event) -> bool:
        """Whether the work before ``event``'s last record has run (never blocks)."""

    def exports_opened(self) -> None:
        """Every peer has opened what this process exported: names it made for them
        (the stand-in's files) may go. Nothing to do on CUDA."""

    def close(self) -> None:
        """Release what the device holds of its own (streams, threads); idempotent."""


def import_runtime():
    """``cupy.cuda.runtime``, with an error that says CUDA and what to install."""
    try:
        return importlib.import_module("cupy.cuda.runtime")
    except ImportError as e:
        raise RuntimeError(
            "the cuda_ipc backend needs CUDA through CuPy: pip install 'commrt[cuda12]' or "
            "'commrt[cuda13]' on a machine with an NVIDIA GPU"
        ) from e


class CudaDevice(IpcDevice):
    """One CUDA device through ``cupy.cuda.runtime``; streams are ``torch.cuda.Stream``."""

    def __init__(self, device: torch.device, runtime=None):
        self.device = device
        self.rt = runtime if runtime is not None else import_runtime()
        torch.cuda.set_device(device)
        self.rt.setDevice(device.index)

    def unusable(self) -> str | None:
        if not self.rt.deviceGetAttribute(ATTR_IPC_EVENTS, self.device.index):
            return f"{self.identity()} cannot share CUDA events between processes"
        return None

    def identity(self) -> str:
        props = torch.cuda.get_device_properties(self.device)
        return f"cuda {self.device.index} {props.uuid}"

    def can_reach(self, peer_identity: str) -> bool:
        if peer_identity == self.identity():
            return True
        other = int(peer_identity.split()[1])
        return bool(self.rt.deviceCanAccessPeer(self.device.index, other))

    def allocate(self, nbytes: int) -> int:
        return self.rt.malloc(max(1, nbytes))

    def free(self, ptr: int) -> None:
        self.rt.free(ptr)

    def export_memory(self, ptr: int) -> bytes:
        return self.rt.ipcGetMemHandle(ptr)

    def open_memory(self, handle: bytes) -> int:
        return self.rt.ipcOpenMemHandle(handle)

    def close_memory(self, ptr: int) -> None:
        self.rt.ipcCloseMemHandle(ptr)

    def new_stream(self):
        return torch.cuda.Stream(self.device)

    def stream_context(self, stream):
        return torch.cuda.stream(stream)

    def copy(self, dst: int, src: int, nbytes: int, stream) -> None:
        if nbytes:
            self.rt.memcpyAsync(dst, src, nbytes, COPY_D2D, stream.cuda_stream)

    def host_copy(self, dst: int, src: int, nbytes: int, stream) -> None:
        if nbytes:  # the direction is read from the addresses (unified addressing)
            self.rt.memcpyAsync(dst, src, nbytes, COPY_ANY, stream.cuda_stream)

    def pin(self, ptr: int, nbytes: int) -> None:
        self.rt.hostRegister(ptr, nbytes, 0)

    def unpin(self, ptr: int) -> None:
        self.rt.hostUnregister(ptr)

    def _tensor(self, ptr: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        """``count`` elements of ``dtype`` at the device address ``ptr`` (this process's
        memory or a peer's opened slab), as a torch tensor that does not own them."""
        cupy = importlib.import_module("cupy")
        nbytes = count * torch.tensor([], dtype=dtype).element_size()
        mem = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, nbytes, None), 0)
        raw = cupy.ndarray((nbytes,), cupy.uint8, mem)  # bytes: cupy has no bf16
        return torch.as_tensor(raw, device=self.device).view(dtype)

    def sum_into(self, dst: int, srcs: list[int], count: int, dtype: torch.dtype, stream) -> None:
        if not count:
            return
        wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        with torch.cuda.stream(stream):
            parts = [self._tensor(p, count, dtype) for p in srcs]
            acc = parts[0].to(wide, copy=True)
            for part in parts[1:]:
                acc.add_(part)
            self._tensor(dst, count, dtype).copy_(acc)

    def host_func(self, stream, fn) -> None:
        self.rt.launchHostFunc(stream.cuda_stream, lambda _: fn(), 0)

    def after_caller(self, stream, tensor: torch.Tensor) -> None:
        stream.wait_stream(torch.cuda.current_stream(self.device))
        tensor.record_stream(stream)

    def caller_after(self, stream) -> None:
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def create_event(self):
        return self.rt.eventCreateWithFlags(EVENT_FLAGS)

    def export_event(self, event) -> bytes:
        return self.rt.ipcGetEventHandle(event)

    def open_event(self, handle: bytes):
        return self.rt.ipcOpenEventHandle(handle)

    def destroy_event(self, event) -> None:
        self.rt.eventDestroy(event)

    def record(self, event, stream) -> None:
        self.rt.eventRecord(event, stream.cuda_stream)

    def wait_event(self, stream, event) -> None:
        self.rt.streamWaitEvent(stream.cuda_stream, event, 0)

    def query(self, event) -> bool:
        status = self.rt.eventQuery(event)
        if status not in (0, NOT_READY):
            raise RuntimeError(f"cudaEventQuery failed with CUDA error {status}")
        return status == 0
