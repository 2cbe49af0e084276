"""Making the shared-memory transport: every rank of a group together, through its store.

:func:`connect` either returns a :class:`~commrt.transports.shm.ShmTransport` on every
rank, or on every rank the same reason why the ranks cannot share memory, so a caller
can fall back to another transport without the ranks disagreeing.
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from commrt.transports.processes import start_time
from commrt.transports.shm_rings import (
    MIN_RING_BYTES,
    ORDERED_ARCHES,
    RING_BYTES,
    RING_HEAD,
    SHM_DIR,
)

if TYPE_CHECKING:
    from commrt.transports.shm import ShmTransport


def unusable() -> str | None:
    """Why this process cannot use shared-memory rings at all (None: it can)."""
    if platform.machine().lower() not in ORDERED_ARCHES:
        return (
            f"the shm transport needs x86-64's memory ordering, not {platform.machine()} "
            "(Python has no memory fence)"
        )
    if not os.path.isdir(SHM_DIR) or not os.access(SHM_DIR, os.W_OK):
        return f"{SHM_DIR} is missing or not writable"
    if start_time(os.getpid()) is None:
        return "/proc is not mounted, so a peer's death could not be seen"
    return None


def ring_size(world_size: int) -> int:
    """A ring's data bytes: :data:`RING_BYTES`, halved until the rings of all ``world_size``
    ranks (all on this host) take at most half of /dev/shm's free space; 0 if even
    :data:`MIN_RING_BYTES` does not fit."""
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    rings = max(1, world_size * (world_size - 1))
    size = RING_BYTES
    while size >= MIN_RING_BYTES and rings * (size + RING_HEAD) > free // 2:
        size //= 2
    return size if size >= MIN_RING_BYTES else 0


def _file_bytes(world_size: int, ring_bytes: int) -> int:
    """A rank's file: one inbound ring per peer."""
    return (world_size - 1) * (RING_HEAD + ring_bytes)


def connect(store, rank: int, world_size: int, timeout: float) -> "ShmTransport | str":
    """Every rank of a group calls this together, through the group's store: each makes
    its file of inbound rings, maps every peer's, and checks that it sees every peer's
    process. Returns the transport, or, on every rank alike, why the ranks cannot share
    memory (another host, another /dev/shm or pid namespace, no room)."""
    # here, not at the top: unusable() (a launcher's check) needs no torch, the transport does
    from commrt.transports.shm import ShmTransport

    if world_size == 1:  # nobody to share with: no files
        alone = ShmTransport(rank, 1, {}, RING_BYTES, {})
        alone.store = store
        return alone
    gen = store.add(f"shm_generation/{rank}", 1)
    key = f"shm/{gen}/"
    reason = unusable()
    if rank == 0:
        size = 0 if reason else ring_size(world_size)
        store.set(key + "plan", f"{secrets.token_hex(8)},{size}")
    store.wait([key + "plan"], timedelta(seconds=timeout))
    token, ring_bytes = bytes(store.get(key + "plan")).decode().split(",")
    ring_bytes = int(ring_bytes)
    if not ring_bytes and reason is None:
        reason = f"rank 0 cannot use {SHM_DIR} (see its log), or it has no room for the rings"
    path = f"{SHM_DIR}/commrt-{token}-{{}}"
    maps: dict[int, mmap.mmap] = {}
    try:
        if reason is None:
            reason = _make(path.format(rank), world_size, ring_bytes, maps, rank)
        # first what each rank found about itself (the cause), then what it found of the others
        made = gather(store, key + "made/", rank, world_size, timeout, _about_me(reason))
        pids = {r: _pid_of(text) for r, text in enumerate(made)}
        bad = _first_reason(text.split(",", 2)[2] for text in made)
        if bad is None:
            why = _map_peers(path, rank, world_size, ring_bytes, maps, pids)
            bad = _first_reason(gather(store, key + "ok/", rank, world_size, timeout, why or ""))
    finally:
        try:  # every rank mapped every file, or gave up: the names can go
            os.unlink(path.format(rank))
        except OSError:
            pass
    if bad is not None:
        for mm in maps.values():
            mm.close()
        return bad
    pids.pop(rank)
    transport = ShmTransport(rank, world_size, maps, ring_bytes, pids)
    transport.store = store
    return transport


def _about_me(reason: str | None) -> str:
    return f"{os.getpid()},{start_time(os.getpid())},{reason or ''}"


def _pid_of(text: str) -> tuple[int, int | None]:
    pid, started, _ = text.split(",", 2)
    return int(pid), int(started) if started != "None" else None


def _first_reason(reasons) -> str | None:
    return next((f"rank {r}: {why}" for r, why in enumerate(reasons) if why), None)


def gather(store, prefix: str, rank: int, world_size: int, timeout: float, mine: str) -> list:
    """Every rank's ``mine``, in rank order, through the store (waits at most ``timeout``)."""
    store.set(prefix + str(rank), mine)
    store.wait([prefix + str(r) for r in range(world_size)], timedelta(seconds=timeout))
    return [bytes(store.get(prefix + str(r))).decode() for r in range(world_size)]


def _make(path: str, world_size: int, ring_bytes: int, maps: dict, rank: int) -> str | None:
    """Create this rank's file of inbound rings, zeroed and with its memory reserved (a
    write to tmpfs that has run out of room is a SIGBUS, not an error)."""
    size = _file_bytes(world_size, ring_bytes)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as e:
        return f"cannot create {path}: {e.strerror}"
    try:
        os.posix_fallocate(fd, 0, size)
        maps[rank] = mmap.mmap(fd, size)
    except OSError as e:
        return f"no room for {size >> 20} MiB of rings in {SHM_DIR}: {e.strerror}"
    finally:
        os.close(fd)
    return None


def _map_peers(
    path: str, rank: int, world_size: int, ring_bytes: int, maps: dict, pids: dict
) -> str | None:
    size = _file_bytes(world_size, ring_bytes)
    for r in range(world_size):
        if r == rank:
            continue
        pid, started = pids[r]
        if started is None or start_time(pid) != started:
            return f"rank {r}'s process (pid {pid}) is not visible here (another host or container)"
        try:
            fd = os.open(path.format(r), os.O_RDWR)
        except OSError:
            return f"rank {r}'s rings are not in this {SHM_DIR} (another host or container)"
        try:
            if os.fstat(fd).st_size != size:
                return f"rank {r}'s rings have another size"
            maps[r] = mmap.mmap(fd, size)
        finally:
            os.close(fd)
    return None
