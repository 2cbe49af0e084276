"""``cuda_ipc``'s one-shot all-reduce of small buffers, summed on the host.

Ranks that time-share one GPU (separate CUDA contexts, no MPS) wait for their
context's turn on the GPU for every kernel and every small copy to the device,
and the device one-shot (:mod:`commrt.transports.cuda_ipc_direct`) adds a
kernel that depends on the peers' copies; a message between two processes
through the host costs far less (the figures are in ``docs/gpus.md``). For a
buffer of at most :data:`HOST_BYTES` (where the two cross,
``bench/bench_gpu_allreduce.py``) the sum is done on the host, with no device
work that depends on another process:

Each rank maps, in ``/dev/shm``, one file of its own: a **posted** counter
and two halves of ``host_bytes``, used by the parity of a round (one round
per call, as the call is at most one half), pinned for the device's copies;
every peer maps it too. Round ``R``:

1. the rank's stream copies its buffer into half ``R % 2`` of its file, and
   its host waits for that copy (a wait on its own stream, the one host wait
   of this path);
2. it raises its posted counter to ``R + 1`` and waits until every peer's
   reaches ``R + 1``: **one wait per peer**;
3. its host sums every rank's half ``R % 2`` in rank order (fp16 and bf16 in
   fp32, rounded once, as :meth:`~commrt.transports.cuda_ipc_device.IpcDevice.sum_into`
   does on the device), so every rank gets the same bits, into its pinned
   result buffer (half ``R % 2``, once the copy out of it two rounds ago ran);
4. its stream copies the result back into the buffer; the caller's stream is
   ordered after it (no host wait).

No exit barrier: a rank rewrites half ``R % 2`` only in round ``R + 2``, after
it saw every peer's counter reach ``R + 2`` in round ``R + 1``; a peer raises
it only after its round-``R`` sum, which ran on its host before it returned.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings

import numpy as np
import torch

from commrt import settings
from commrt.transports.base import poll_until
from commrt.transports.cuda_ipc_direct import PeerCounters, map_file, new_file
from commrt.transports.shm_connect import gather

#: bytes of the largest all-reduce summed on the host (COMMRT_CUDA_IPC_HOST_BYTES's default)
HOST_BYTES: int = settings.CUDA_IPC_HOST_BYTES.value.default
#: where a rank's halves begin in its file (page-aligned, for pinning)
HALVES_AT = 4096


class HostWorkspace(PeerCounters):
    """One rank's file of two halves and its view of every peer's (see the module
    docs). Made by :meth:`make`, every rank together, at the first call it serves."""

    def __init__(self, transport, half_bytes: int):
        self.tr, self.dev = transport, transport.dev
        self.half = -(-half_bytes // 64) * 64
        self.rounds = 0  # rounds this rank has begun
        self.maps: list[mmap.mmap] = []  # per rank: its file, mapped here
        self.posted: list[np.ndarray] = []  # per rank: its counter (one uint64)
        self.halves: list[list[torch.Tensor]] = []  # per rank, per parity: bytes
        self.result: mmap.mmap | None = None  # this rank's two result halves
        self.results: list[torch.Tensor] = []  # per parity: bytes
        self.pinned: list[int] = []  # addresses this rank pinned
        self.copied = self.returned = None  # events: the copy in; per parity, the copy out

    def make(self, timeout: float) -> None:
        """Map, pin and share every rank's file (collective)."""
        tr, rank, p = self.tr, self.tr.rank, self.tr.world_size
        size = HALVES_AT + 2 * self.half
        path = new_file("ipc-host", size)
        key = f"{tr.keys}host-workspace/"
        paths = gather(tr.store, key + "made/", rank, p, timeout, json.dumps(path))
        for theirs in map(json.loads, paths):
            self.maps.append(map_file(theirs, size))
            self.posted.append(np.frombuffer(self.maps[-1], np.uint64, 1))
            whole = torch.frombuffer(self.maps[-1], dtype=torch.uint8)
            self.halves.append([whole[self._at(par) : self._at(par) + self.half] for par in (0, 1)])
        gather(tr.store, key + "opened/", rank, p, timeout, "1")
        os.unlink(path)
        self.result = mmap.mmap(-1, 2 * self.half)
        out = torch.frombuffer(self.result, dtype=torch.uint8)
        self.results = [out[: self.half], out[self.half :]]
        self._pin(self.halves[rank][0].data_ptr(), 2 * self.half)
        self._pin(self.results[0].data_ptr(), 2 * self.half)
        self.copied = self.dev.create_event()
        self.returned = [self.dev.create_event(), self.dev.create_event()]

    def _at(self, parity: int) -> int:
        return HALVES_AT + parity * self.half

    def _pin(self, ptr: int, nbytes: int) -> None:
        """Pin host memory for the device's copies; unpinned they still run, staged by the
        driver, so a refusal (a locked-memory limit) is a warning, not an error."""
        try:
            self.dev.pin(ptr, nbytes)
            self.pinned.append(ptr)
        except RuntimeError as e:
            warnings.warn(
                f"commrt: cuda_ipc could not pin {nbytes} bytes of host memory "
                f"({e}); small all-reduces go through it unpinned, more slowly",
                RuntimeWarning,
                stacklevel=2,
            )

    def all_reduce(self, buf: torch.Tensor, deadline: float) -> int | None:
        """Sum every rank's ``buf`` (at most :attr:`half` bytes) into ``buf``; the peer whose
        wait timed out, or None. ``buf``'s copy back is enqueued on the transport's stream."""
        tr, dev, stream = self.tr, self.dev, self.tr.dev_stream
        nbytes, r = buf.numel() * buf.element_size(), self.rounds
        par = self.parity(r)
        self.rounds += 1
        mine = self.halves[tr.rank][par]
        dev.host_copy(mine.data_ptr(), buf.data_ptr(), nbytes, stream)
        dev.record(self.copied, stream)
        tr.tally.launches += 1
        if not self._copied(deadline):
            tr.broken = "the copy to the host did not finish in time"
            return tr.rank
        self.posted[tr.rank][0] = r + 1
        for q in range(tr.world_size):
            if q != tr.rank and not self._posted(q, r + 1, deadline):
                return q
        out = self.results[par]
        if not poll_until(lambda: dev.query(self.returned[par]), deadline):
            tr.broken = "the copy back from the host did not finish in time"
            return tr.rank
        dtype = buf.dtype
        wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        parts = [h[par][:nbytes].view(dtype) for h in self.halves]
        acc = parts[0].to(wide, copy=True)
        for part in parts[1:]:
            acc.add_(part)
        out[:nbytes].view(dtype).copy_(acc)
        dev.host_copy(buf.data_ptr(), out.data_ptr(), nbytes, stream)
        dev.record(self.returned[par], stream)
        tr.tally.launches += 1
        return None

    def parity(self, r: int) -> int:
        """Which half round ``r`` uses."""
        return r % 2

    def _copied(self, deadline: float) -> bool:
        """The host's wait for its own stream's copy in (before its counter says the
        bytes are there); False at ``deadline``."""
        self.tr.tally.stream_waits += 1
        return poll_until(lambda: self.dev.query(self.copied), deadline)

    def release(self, clean: bool) -> None:
        """Unpin and unmap, only if ``clean``: a copy still queued may use the memory, and
        the process's end frees it."""
        if clean:
            for ptr in self.pinned:
                self.dev.unpin(ptr)
            for event in [self.copied, *(self.returned or [])]:
                if event is not None:
                    self.dev.destroy_event(event)
        self.pinned, self.posted, self.halves, self.results = [], [], [], []
        for mm in [*self.maps, self.result] if clean else []:
            try:
                if mm is not None:
                    mm.close()
            except BufferError:  # a view still exported: the mapping goes with it
                pass
        self.maps, self.result = [], None
