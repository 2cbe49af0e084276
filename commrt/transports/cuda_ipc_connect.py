"""Making the ``cuda_ipc`` transport: every rank of a group together, through its store.

:func:`connect` returns a :class:`~commrt.transports.cuda_ipc.CudaIpcTransport` on
every rank, or on every rank the same reason why these ranks cannot share
device memory (no CUDA IPC here, another host, a device without peer access
to another's), so that a caller refuses, or falls back, on every rank alike.

What each rank makes and exports, in three rounds through the store:

1. who it is: pid and start time, the host's boot id, its device's
   identity, and why it cannot take part (if so); then what it found of
   the others (another host, no peer access);
2. its counters file in ``/dev/shm`` (one block per inbound link), one
   device slab holding every inbound link's slots, and per peer the slot
   events it records (``ready`` for its sends, ``consumed`` for its
   receives), all as handles;
3. whether it could open every peer's. Then the counters files are unlinked
   (a crash leaves nothing in ``/dev/shm``).
"""

from __future__ import annotations

import json
import mmap
import os
import secrets

import numpy as np
import torch

from commrt import settings
from commrt.transports.base import ON_A_CPU
from commrt.transports.cuda_ipc import SLOT_BYTES, SLOTS, CudaIpcTransport, Link, link_bytes
from commrt.transports.cuda_ipc_device import CudaDevice, IpcDevice, import_runtime
from commrt.transports.cuda_ipc_host import HOST_BYTES
from commrt.transports.processes import start_time
from commrt.transports.shm_connect import SHM_DIR, gather
from commrt.transports.shm_connect import unusable as host_unusable


def boot_id() -> str:
    """This host's boot id (ranks on another host, or another boot, have another)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _index(src: int, dst: int) -> int:
    """Where ``src``'s link to ``dst`` sits among ``dst``'s inbound links."""
    return src if src < dst else src - 1


def _first(reasons) -> str | None:
    return next((f"rank {r}: {why}" for r, why in enumerate(reasons) if why), None)


def reach_problem(rank: int, me: dict, others: list[dict], dev: IpcDevice) -> str:
    """What this rank finds of the others: why it cannot reach one ("" if it reaches all)."""
    for r, o in enumerate(others):
        if r == rank:
            continue
        if o["boot"] != me["boot"] or start_time(o["pid"]) != o["start"]:
            return f"rank {r} is on another host (its process is not visible here)"
        if not dev.can_reach(o["identity"]):
            return (
                f"{me['identity']} has no peer access to rank {r}'s {o['identity']} "
                "(cuda_ipc needs one GPU, or GPUs with peer access such as NVLink)"
            )
    return ""


def refusal(store, key: str, rank: int, world_size: int, dev: IpcDevice, timeout: float):
    """Round 1: (None, every rank's self-description) or (the first reason, None)."""
    why = host_unusable() or dev.unusable() or ""
    me = {
        "pid": os.getpid(),
        "start": start_time(os.getpid()),
        "boot": boot_id(),
        "identity": "" if why else dev.identity(),
        "why": why,
    }
    about = [
        json.loads(x)
        for x in gather(store, key + "who/", rank, world_size, timeout, json.dumps(me))
    ]
    bad = _first(o["why"] for o in about)
    if bad is None:
        mine = reach_problem(rank, me, about, dev)
        bad = _first(gather(store, key + "views/", rank, world_size, timeout, mine))
    return (bad, None) if bad else (None, about)


class _Made:
    """What this rank made and opened, and how to give it back (``release``)."""

    def __init__(self, dev: IpcDevice, world_size: int, slots: int, slot_bytes: int):
        self.dev, self.slots, self.slot_bytes = dev, slots, slot_bytes
        self.maps: list[mmap.mmap] = []
        self.opened_mem: list[int] = []
        self.events: list = []
        self.slab = 0
        self.path = f"{SHM_DIR}/commrt-ipc-{secrets.token_hex(8)}"
        self.file_bytes = max(1, world_size - 1) * link_bytes(slots)

    def make(self, rank: int, world_size: int) -> dict:
        """The counters file, the slab, the events; their handles as JSON-able text."""
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.file_bytes)
            self.maps.append(mmap.mmap(fd, self.file_bytes))
        finally:
            os.close(fd)
        self.slab = self.dev.allocate(max(1, world_size - 1) * self.slots * self.slot_bytes)
        peers = [p for p in range(world_size) if p != rank]
        self.ready = {p: [self._event() for _ in range(self.slots)] for p in peers}
        self.consumed = {p: [self._event() for _ in range(self.slots)] for p in peers}
        ex = self.dev.export_event
        return {
            "counters": self.path,
            "slab": self.dev.export_memory(self.slab).hex(),
            "ready": {p: [ex(e).hex() for e in evs] for p, evs in self.ready.items()},
            "consumed": {p: [ex(e).hex() for e in evs] for p, evs in self.consumed.items()},
        }

    def _event(self):
        ev = self.dev.create_event()
        self.events.append(ev)
        return ev

    def _block(self, mm: mmap.mmap, index: int) -> np.ndarray:
        size = link_bytes(self.slots)
        return np.frombuffer(mm, np.uint8, size, index * size)

    def open_links(self, rank: int, theirs: list[dict]) -> dict:
        """peer -> (outbound Link, inbound Link), with every peer's handles opened."""
        links, per_link = {}, self.slots * self.slot_bytes
        for p, h in enumerate(theirs):
            if p == rank:
                continue
            fd = os.open(h["counters"], os.O_RDWR)
            try:
                mm = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            self.maps.append(mm)
            slab = self.dev.open_memory(bytes.fromhex(h["slab"]))
            self.opened_mem.append(slab)
            their_consumed = [self._open(x) for x in h["consumed"][str(rank)]]
            their_ready = [self._open(x) for x in h["ready"][str(rank)]]
            out = Link(
                p,
                slab + _index(rank, p) * per_link,
                self.ready[p],
                their_consumed,
                self._block(mm, _index(rank, p)),
            )
            inb = Link(
                p,
                self.slab + _index(p, rank) * per_link,
                their_ready,
                self.consumed[p],
                self._block(self.maps[0], _index(p, rank)),
            )
            links[p] = (out, inb)
        return links

    def _open(self, hexed: str):
        ev = self.dev.open_event(bytes.fromhex(hexed))
        self.events.append(ev)
        return ev

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def release(self, clean: bool) -> None:
        """Give everything back; unless ``clean``, leave device memory and events alone (a
        copy still queued may touch them: the process's end frees them)."""
        self.unlink()
        if clean:
            for ptr in self.opened_mem:
                self.dev.close_memory(ptr)
            for ev in self.events:
                self.dev.destroy_event(ev)
            if self.slab:
                self.dev.free(self.slab)
        self.opened_mem, self.events, self.slab = [], [], 0
        for mm in self.maps:
            try:
                mm.close()
            except BufferError:  # a numpy view still exported: the mapping goes with it
                pass
        self.maps = []
        self.dev.close()


def connect(
    store,
    rank: int,
    world_size: int,
    dev: IpcDevice,
    timeout: float,
    slot_bytes: int = SLOT_BYTES,
    slots: int = SLOTS,
    host_bytes: int = HOST_BYTES,
) -> CudaIpcTransport | str:
    """Every rank of a group calls this together: the transport, or on every rank alike
    the reason these ranks cannot share device memory (see the module docs).
    ``host_bytes``: the largest one-shot summed on the host
    (:mod:`commrt.transports.cuda_ipc_host`), the same on every rank or refused."""
    if slot_bytes < 16 or slot_bytes % 16 or slots < 1:
        raise ValueError(
            f"cuda_ipc: slot_bytes must be a positive multiple of 16 and slots "
            f"at least 1, got {slot_bytes} and {slots}"
        )
    made = _Made(dev, world_size, slots, slot_bytes)
    if world_size == 1:
        transport = CudaIpcTransport(rank, 1, dev, {}, {}, slot_bytes, made.release)
        transport.host_bytes = host_bytes
        return transport
    key = f"cuda_ipc/{store.add(f'cuda_ipc_generation/{rank}', 1)}/"
    bad, about = refusal(store, key, rank, world_size, dev, timeout)
    if bad is not None:
        return bad
    links, why = {}, ""
    try:
        try:
            mine = json.dumps(made.make(rank, world_size))
        except (OSError, RuntimeError) as e:
            mine, why = "{}", f"cannot make its slab, events or counters: {e}"
        handles = gather(
            store,
            key + "made/",
            rank,
            world_size,
            timeout,
            json.dumps({"why": why, "handles": json.loads(mine), "host_bytes": host_bytes}),
        )
        handles = [json.loads(x) for x in handles]
        bad = _first(h["why"] for h in handles) or _host_bytes_differ(handles)
        if bad is None:
            try:
                links = made.open_links(rank, [h["handles"] for h in handles])
            except (OSError, RuntimeError, KeyError) as e:
                why = f"cannot open a peer's slab, events or counters: {e}"
            bad = _first(gather(store, key + "ok/", rank, world_size, timeout, why))
    finally:
        made.unlink()
    if bad is not None:
        made.release(clean=True)
        return bad
    dev.exports_opened()
    pids = {p: (o["pid"], o["start"]) for p, o in enumerate(about) if p != rank}
    transport = CudaIpcTransport(rank, world_size, dev, links, pids, slot_bytes, made.release)
    transport.store, transport.keys = store, key
    transport.host_bytes = host_bytes
    return transport


def _host_bytes_differ(handles: list[dict]) -> str | None:
    """Why the ranks cannot agree on which all-reduces go through the host (None: they
    agree): a rank that sums on the host would wait forever for one that does not."""
    seen = [h["host_bytes"] for h in handles]
    if len(set(seen)) == 1:
        return None
    per = ", ".join(f"rank {r}: {b}" for r, b in enumerate(seen))
    return f"{settings.CUDA_IPC_HOST_BYTES.name} differs between ranks ({per})"


def cuda_missing() -> str | None:
    """Why this process cannot drive a CUDA device for ``cuda_ipc`` (None: it can)."""
    if not torch.cuda.is_available():
        return (
            "backend 'cuda_ipc' needs CUDA, and torch sees no CUDA GPU here "
            f"(torch.cuda.is_available() is False); {ON_A_CPU}"
        )
    try:
        import_runtime()
    except RuntimeError as e:
        return str(e)
    return None


def cuda_device(device, local_rank: int) -> IpcDevice:
    """The CUDA device this rank drives: ``device`` if it names one, else
    ``cuda:<local_rank % device_count()>`` (so several ranks share one GPU where
    there is one); a RuntimeError naming CUDA where there is none."""
    missing = cuda_missing()
    if missing is not None:
        raise RuntimeError(missing)
    device = None if device is None else torch.device(device)
    if device is not None and device.type != "cuda":
        raise ValueError(f"backend 'cuda_ipc' moves CUDA tensors, not {device.type}")
    if device is None or device.index is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return CudaDevice(device)


def slot_bytes_from_env(env=None) -> int:
    """``COMMRT_CUDA_IPC_SLOT_BYTES`` (default :data:`SLOT_BYTES`): the bytes of one slot.
    Each rank holds ``(world_size - 1) * SLOTS`` of them in device memory; larger slots
    mean fewer pieces per message, smaller ones less memory."""
    return settings.CUDA_IPC_SLOT_BYTES.get(env)


def host_bytes_from_env(env=None) -> int:
    """``COMMRT_CUDA_IPC_HOST_BYTES`` (default :data:`HOST_BYTES`): the largest all-reduce
    whose one-shot is summed on the host; 0: none is."""
    return settings.CUDA_IPC_HOST_BYTES.get(env)


def make_transport(store, rank: int, world_size: int, dev: IpcDevice, timeout: float):
    """:func:`connect` (slots of :func:`slot_bytes_from_env`, the host sums' bound of
    :func:`host_bytes_from_env`), or, on every rank alike, a ValueError that says why not."""
    made = connect(
        store,
        rank,
        world_size,
        dev,
        timeout,
        slot_bytes_from_env(),
        host_bytes=host_bytes_from_env(),
    )
    if isinstance(made, str):
        dev.close()
        raise ValueError(
            f"commrt: backend 'cuda_ipc': these ranks cannot share device memory ({made}); "
            "use backend='nccl' (one GPU per rank) or a CPU backend"
        )
    return made


def init_cuda_ipc(
    store,
    rank: int,
    world_size: int,
    device,
    local_rank: int,
    timeout: float,
    dev: IpcDevice | None = None,
):
    """The transport :func:`commrt.init` makes for ``backend="cuda_ipc"``: on ``dev``, else on
    :func:`cuda_device` (which names CUDA where there is none), through ``store``."""
    dev = dev if dev is not None else cuda_device(device, local_rank)
    return make_transport(store, rank, world_size, dev, timeout)
