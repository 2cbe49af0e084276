"""``cuda_ipc``'s one-shot all-reduce: one workspace per rank, one wait per peer per round.

The slot protocol of :mod:`commrt.transports.cuda_ipc` pays two cross-process
waits per piece per direction (a counter in ``/dev/shm`` and an IPC event). A
one-shot all-reduce needs less: every rank reads every other rank's buffer,
so a rank only has to know that each peer's buffer is ready.

Each rank exports one **workspace**: two halves of :data:`HALF_BYTES` (at most
32 MiB in all), used by the parity of a *round*, and one **posted** counter
in ``/dev/shm`` that its peers map. Round ``R`` (a call takes one round per
half's size of its buffer; every rank counts rounds alike, as collectives are
called in the same order on every rank):

1. the rank's stream copies its piece into half ``R % 2`` of its workspace,
   then raises its posted counter to ``R + 1`` by a host function
   (:meth:`~commrt.transports.cuda_ipc_device.IpcDevice.host_func`), which
   runs only once the copy has run;
2. its host waits until every peer's posted counter reaches ``R + 1``: **one
   wait per peer**, on the host, never a device spin (ranks that time-share a
   GPU would spin out whole slices);
3. its stream sums every rank's half ``R % 2`` in rank order
   (:meth:`~commrt.transports.cuda_ipc_device.IpcDevice.sum_into`) into the
   caller's buffer, so every rank gets the same bits.

No exit barrier: a rank rewrites half ``R % 2`` only in round ``R + 2``, after it
saw every peer's counter reach ``R + 2`` in round ``R + 1``; a peer raises it
after its round-``R`` sum on its stream, so that sum has read the half.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets

import numpy as np
import torch

from commrt.transports.base import poll_until
from commrt.transports.shm_connect import SHM_DIR, gather

#: bytes of each half of a rank's workspace (two halves: 32 MiB per rank)
HALF_BYTES = 16 << 20
#: the dtypes the workspace sums (others run the schedule step by step)
SUMS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def new_file(kind: str, size: int) -> str:
    """A new file of ``size`` bytes (reserved) in ``/dev/shm`` for this rank's peers to
    map, named for ``kind``; its path (unlinked once every peer opened it)."""
    path = f"{SHM_DIR}/commrt-{kind}-{secrets.token_hex(8)}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return path


def map_file(path: str, size: int) -> mmap.mmap:
    """The first ``size`` bytes of the file at ``path``, mapped shared."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class PeerCounters:
    """The one wait on a peer in a one-shot's round: its **posted** counter (``posted``,
    one uint64 per rank, in files every rank maps) reaching the round's value."""

    tr: object  # the transport (its rank, its tally, its peers' liveness)
    posted: list[np.ndarray]

    def _posted(self, peer: int, value: int, deadline: float) -> bool:
        """The one wait on ``peer`` in a round: until its counter reaches ``value`` (its
        piece is there); False at ``deadline``. A dead peer is named meanwhile."""
        counter, tr = self.posted[peer], self.tr
        tr.tally.peer_wait(peer)
        return poll_until(
            lambda: int(counter[0]) >= value, deadline, check=lambda: tr.check_peers([peer])
        )


class Workspace(PeerCounters):
    """One rank's workspace and its view of every peer's (see the module docs). Made by
    :meth:`make`, every rank together, at the first one-shot call."""

    def __init__(self, transport, half_bytes: int | None = None):
        self.tr, self.dev = transport, transport.dev
        self.half = half_bytes or HALF_BYTES
        self.rounds = 0  # rounds this rank has begun
        self.bases: list[int] = []  # per rank: its workspace's address here
        self.posted: list[np.ndarray] = []  # per rank: its counter (one uint64)
        self.maps: list[mmap.mmap] = []
        self.mine, self.opened = 0, []

    def make(self, timeout: float) -> None:
        """Allocate, export, and open every peer's workspace and counter (collective)."""
        tr, rank, p = self.tr, self.tr.rank, self.tr.world_size
        path = new_file("ipc-posted", 64)
        self.mine = self.dev.allocate(2 * self.half)
        key = f"{tr.keys}workspace/"
        mine = json.dumps({"posted": path, "slab": self.dev.export_memory(self.mine).hex()})
        theirs = [json.loads(x) for x in gather(tr.store, key + "made/", rank, p, timeout, mine)]
        for r, h in enumerate(theirs):
            self.maps.append(map_file(h["posted"], 64))
            self.posted.append(np.frombuffer(self.maps[-1], np.uint64, 1))
            if r == rank:
                self.bases.append(self.mine)
            else:
                self.opened.append(self.dev.open_memory(bytes.fromhex(h["slab"])))
                self.bases.append(self.opened[-1])
        gather(tr.store, key + "opened/", rank, p, timeout, "1")
        os.unlink(path)
        self.dev.exports_opened()

    def all_reduce(self, buf: torch.Tensor, deadline: float) -> int | None:
        """Enqueue the one-shot sum of every rank's ``buf`` into ``buf``, in rounds of
        :attr:`half` bytes; the peer whose wait timed out, or None."""
        tr, dev, stream = self.tr, self.dev, self.tr.dev_stream
        size = buf.element_size()
        per = max(1, self.half // size)
        ptr, numel = buf.data_ptr(), buf.numel()
        peers = [q for q in range(tr.world_size) if q != tr.rank]
        for lo in range(0, numel, per):
            count = min(per, numel - lo)
            r, off = self.rounds, self.offset(self.rounds)
            self.rounds += 1
            dev.copy(self.mine + off, ptr + lo * size, count * size, stream)
            dev.host_func(stream, self._poster(r + 1))
            tr.tally.launches += 2
            late = next((q for q in peers if not self._posted(q, r + 1, deadline)), None)
            if late is not None:
                return late
            dev.sum_into(ptr + lo * size, [b + off for b in self.bases], count, buf.dtype, stream)
            tr.tally.launches += 1
        return None

    def offset(self, r: int) -> int:
        """Where round ``r``'s piece goes in a workspace: the half of its parity."""
        return (r % 2) * self.half

    def _poster(self, value: int):
        counter = self.posted[self.tr.rank]

        def post() -> None:
            counter[0] = value

        return post

    def release(self, clean: bool) -> None:
        """Unmap the peers' workspaces and free this rank's (only if ``clean``: a copy
        still queued may touch them, and the process's end frees them)."""
        if clean:
            for ptr in self.opened:
                self.dev.close_memory(ptr)
            if self.mine:
                self.dev.free(self.mine)
        self.opened, self.mine, self.posted = [], 0, []
        for mm in self.maps:
            try:
                mm.close()
            except BufferError:  # a numpy view still exported: the mapping goes with it
                pass
        self.maps = []
