"""Starting an NCCL transport: which GPU, and how every rank learns the unique id.

Rank 0 makes the ``ncclUniqueId``; the others learn it over MPI (under
mpiexec without a port) or through the job's TCPStore. A store can outlive
one :func:`commrt.init`: torchrun's agent store survives elastic restarts,
and a second ``init`` on the same port in one job finds the first one's
keys. So the id is never published under a fixed key:

- every attempt of a torchrun job has its own key space
  (``TORCHELASTIC_RESTART_COUNT``, as torch.distributed's own rendezvous
  does), so a restarted job never sees a dead attempt's keys;
- within an attempt, each rank counts its own NCCL inits in the store
  (``nccl_generation/<rank>``, which only that rank increments). Creating
  a communicator is collective, so a rank's g-th init pairs with every
  other rank's g-th init, and the id lives at ``nccl_unique_id/<g>``.
  A non-zero rank that races ahead of rank 0 waits for key ``g`` to
  appear; it cannot take generation g-1's id, since it knows its own g
  without asking rank 0.

This module does not import :mod:`commrt.runtime.communicator` (which imports it lazily):
init hands in the MPI world or a function that makes the store.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from commrt.transports.nccl import NcclTransport, import_nccl


def nccl_device(device, local_rank: int, device_count: Callable[[], int] | None = None):
    """The CUDA device this rank drives: ``None`` or ``"cuda"`` without an index mean
    ``cuda:<local_rank % device_count()>``; anything else is taken as given."""
    device = None if device is None else torch.device(device)
    if device is not None and (device.type != "cuda" or device.index is not None):
        return device
    count = (device_count or torch.cuda.device_count)()
    if count < 1:
        raise RuntimeError(
            "backend 'nccl' needs a CUDA GPU and none is available here; use backend='shm' "
            "(ranks on one host), backend='mpi' (under mpiexec) or backend='gloo', or "
            "backend='auto'"
        )
    return torch.device("cuda", local_rank % count)


def uid_bytes(uid) -> bytes:
    """The ncclUniqueId as the 128 bytes cupy >= 14 expects (older cupys give signed chars)."""
    return (
        bytes(uid)
        if isinstance(uid, (bytes, bytearray))
        else bytes((int(x) + 256) % 256 for x in uid)
    )


def attempt_prefix(env=None) -> str:
    """The key space of this attempt of a torchrun job (``attempt0`` elsewhere)."""
    env = os.environ if env is None else env
    return f"attempt{env.get('TORCHELASTIC_RESTART_COUNT', '0') or '0'}"


def exchange_unique_id(store, rank: int, uid: bytes | None) -> bytes:
    """Rank 0 publishes ``uid``; every rank returns this generation's id (see the module
    docs). Blocks, up to the store's timeout, until rank 0 has published it."""
    base = f"nccl/{attempt_prefix()}"
    gen = store.add(f"{base}/nccl_generation/{rank}", 1)
    key = f"{base}/nccl_unique_id/{gen}"
    if rank == 0:
        store.set(key, uid)
    return bytes(store.get(key))


def init_nccl(
    rank: int,
    world_size: int,
    local_rank: int,
    device,
    nccl_module=None,
    *,
    mpi_world=None,
    make_store: Callable[[], object] | None = None,
    timeout: float,
) -> NcclTransport:
    """An :class:`NcclTransport`; the unique id travels over ``mpi_world`` when given,
    else through the store ``make_store()`` returns. ``timeout`` bounds the calls NCCL
    itself never times out (:mod:`commrt.transports.watchdog`)."""
    nccl = nccl_module if nccl_module is not None else import_nccl()
    device = nccl_device(device, local_rank)
    uid = uid_bytes(nccl.get_unique_id()) if rank == 0 else None
    store = None
    if mpi_world is not None:
        uid = mpi_world.bcast(uid, root=0)
    else:
        store = make_store()
        uid = exchange_unique_id(store, rank, uid)
    # the store lives until the communicator exists: rank 0 may host it, and creating the
    # communicator is collective, so once it returns every rank has read the id (dropped
    # earlier, a rank that reads late finds the store's server gone)
    transport = NcclTransport(rank, world_size, uid, device, nccl=nccl, timeout=timeout)
    del store
    return transport
