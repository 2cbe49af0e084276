"""A strict CPU stand-in for the ``cuda_ipc`` transport's device.

It implements :class:`commrt.transports.cuda_ipc_device.IpcDevice` with host
memory, so the transport's control logic runs in real processes on a CPU:

* **Slabs** are files in ``/dev/shm``, mapped by every process that opens
  their handle (the file's name), and filled with 0xFF bytes (NaN in every
  float type) when made, so a read before the write shows.
* **Streams** are worker threads that run their work in issue order, each
  item no earlier than ``latency_s`` (times a random factor in [0.5, 1.5))
  after it was issued: device work completes *later* than the host issued
  it, so a host that reads too early, or a copy that is not ordered after
  another process's, sees old bytes.
* **Events** live in shared memory (two counters: records issued, records
  done) and follow CUDA's rule: a stream's :meth:`wait_event` waits for the
  most recent record issued *before* the wait, and for nothing if there was
  none; :meth:`query` says whether the last record issued has run.
* ``peer_access=False`` with distinct ``name``\\ s models GPUs without peer
  access: :meth:`can_reach` is then False between them.

It checks commrt's protocol against CUDA's ordering rules; it says nothing
about CUDA, a GPU or its speed. Never report it as a GPU result.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import queue
import random
import secrets
import threading
import time

import numpy as np
import torch

from commrt.transports.cuda_ipc_connect import boot_id
from commrt.transports.cuda_ipc_device import IpcDevice

SHM = "/dev/shm"
#: events one device can make (each one cache line of its pool file)
EVENTS = 4096


def _map(path: str, size: int | None = None, create: bool = False) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size or os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _tensor(ptr: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``count`` elements of ``dtype`` at the address ``ptr``, not owned."""
    nbytes = count * torch.tensor([], dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype)


class Stream:
    """A thread that runs work items in order, each at least half its device's
    ``latency_s`` (as it is at the issue) after its issue."""

    def __init__(self, device: "StandInDevice", rng: random.Random):
        self.device, self.rng = device, rng
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = False
        self.last_due = 0.0
        self.thread = threading.Thread(target=self._run, name="standin-stream", daemon=True)
        self.thread.start()

    def enqueue(self, work) -> None:
        due = time.monotonic() + self.device.latency_s * (0.5 + self.rng.random())
        self.last_due = max(self.last_due, due)
        self.q.put((self.last_due, work))

    def _run(self) -> None:
        while True:
            due, work = self.q.get()
            if work is None or self.closed:
                return
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            work()


class Event:
    """Two counters in shared memory: records issued (by the host) and done (by a stream)."""

    def __init__(self, words: np.ndarray, handle: bytes):
        self.words, self.handle = words, handle


class StandInDevice(IpcDevice):
    """See the module docs. ``latency_s``: how late stream work runs; ``name``: which
    "GPU" this is; ``peer_access``: whether different names can reach each other."""

    def __init__(self, latency_s: float = 0.002, name: str = "gpu0", peer_access: bool = True,
                 seed: int | None = None):  # fmt: skip
        self.device = torch.device("cpu")
        self.latency_s, self.name, self.peer_access = latency_s, name, peer_access
        self.rng = random.Random(seed)
        self.streams: list[Stream] = []
        self.maps: dict[str, mmap.mmap] = {}  # path -> mapping (made here or opened)
        self.arrays: dict[int, tuple[str, np.ndarray]] = {}  # address -> (path, view)
        self.made: list[str] = []  # files this process made (unlinked once opened)
        self.pool_path = f"{SHM}/commrt-standin-{os.getpid()}-{secrets.token_hex(4)}"
        self.pool_next = 0
        self.closed = False

    def unusable(self) -> str | None:
        return None

    def identity(self) -> str:
        return f"standin {boot_id()} {self.name}"

    def can_reach(self, peer_identity: str) -> bool:
        return peer_identity == self.identity() or self.peer_access

    # -- memory
    def _view(self, path: str) -> int:
        arr = np.frombuffer(self.maps[path], np.uint8)
        self.arrays[arr.ctypes.data] = (path, arr)
        return arr.ctypes.data

    def allocate(self, nbytes: int) -> int:
        path = f"{SHM}/commrt-standin-{os.getpid()}-{secrets.token_hex(6)}"
        self.maps[path] = mm = _map(path, max(1, nbytes), create=True)
        self.made.append(path)
        mm.write(b"\xff" * len(mm))
        return self._view(path)

    def _drop(self, ptr: int) -> None:
        path = self.arrays.pop(ptr)[0]  # (the view goes first: the map cannot close under it)
        with contextlib.suppress(BufferError):
            self.maps.pop(path).close()

    def free(self, ptr: int) -> None:
        self._drop(ptr)

    def export_memory(self, ptr: int) -> bytes:
        return self.arrays[ptr][0].encode()

    def open_memory(self, handle: bytes) -> int:
        path = handle.decode()
        self.maps[path] = _map(path)
        return self._view(path)

    def close_memory(self, ptr: int) -> None:
        self._drop(ptr)

    # -- streams
    def new_stream(self) -> Stream:
        s = Stream(self, self.rng)
        self.streams.append(s)
        return s

    def stream_context(self, stream):
        return contextlib.nullcontext()

    def copy(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        if nbytes:
            stream.enqueue(lambda: ctypes.memmove(dst, src, nbytes))

    def host_copy(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        self.copy(dst, src, nbytes, stream)

    def pin(self, ptr: int, nbytes: int) -> None:
        """Host memory is all this device has: nothing to pin."""

    def unpin(self, ptr: int) -> None:
        """Nothing was pinned."""

    def sum_into(self, dst: int, srcs: list, count: int, dtype: torch.dtype, stream) -> None:
        if not count:
            return
        wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

        def run() -> None:
            parts = [_tensor(p, count, dtype) for p in srcs]
            acc = parts[0].to(wide, copy=True)
            for part in parts[1:]:
                acc.add_(part)
            _tensor(dst, count, dtype).copy_(acc)

        stream.enqueue(run)

    def host_func(self, stream, fn) -> None:
        stream.enqueue(fn)

    def after_caller(self, stream, tensor: torch.Tensor) -> None:
        """The caller's CPU writes are done when it calls: nothing to order."""

    def caller_after(self, stream) -> None:
        """The transport's host waits already ordered the caller after the stream."""

    # -- events
    def _pool(self) -> mmap.mmap:
        if self.pool_path not in self.maps:
            self.maps[self.pool_path] = _map(self.pool_path, EVENTS * 64, create=True)
            self.made.append(self.pool_path)
        return self.maps[self.pool_path]

    def _event(self, path: str, index: int) -> Event:
        words = np.frombuffer(self.maps[path], np.uint64, 2, index * 64)
        return Event(words, json.dumps([path, index]).encode())

    def create_event(self) -> Event:
        self._pool()
        if self.pool_next >= EVENTS:
            raise RuntimeError(f"the stand-in device makes at most {EVENTS} events")
        self.pool_next += 1
        return self._event(self.pool_path, self.pool_next - 1)

    def export_event(self, event: Event) -> bytes:
        return event.handle

    def open_event(self, handle: bytes) -> Event:
        path, index = json.loads(handle)
        if path not in self.maps:
            self.maps[path] = _map(path)
        return self._event(path, index)

    def destroy_event(self, event: Event) -> None:
        """Pool slots are not reused: nothing to do."""

    def record(self, event: Event, stream: Stream) -> None:
        event.words[0] += 1
        n = int(event.words[0])

        def mark() -> None:
            event.words[1] = max(int(event.words[1]), n)

        stream.enqueue(mark)

    def wait_event(self, stream: Stream, event: Event) -> None:
        target = int(event.words[0])  # the last record issued before this wait
        if target == 0:
            return

        def wait() -> None:
            while int(event.words[1]) < target and not stream.closed:
                time.sleep(2e-4)

        stream.enqueue(wait)

    def query(self, event: Event) -> bool:
        return int(event.words[1]) >= int(event.words[0])

    def exports_opened(self) -> None:
        for path in self.made:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.made = []

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for s in self.streams:
            s.closed = True
            s.q.put((0.0, None))
        for s in self.streams:
            s.thread.join(timeout=5.0)
        self.exports_opened()
        self.arrays.clear()
        for mm in self.maps.values():
            with contextlib.suppress(BufferError):
                mm.close()
        self.maps.clear()
