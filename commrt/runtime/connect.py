"""Making the transport ``commrt.init`` chose: the first of its candidates that can be
made here (:func:`make_transport`), CPU transports in auto's order (:func:`cpu_transport`,
which the torch backend's groups use too), MPI's over MPI's world, a replacement's that
rejoins a running job, and NCCL's. The communicator stands on what this returns."""

from __future__ import annotations

from commrt import settings
from commrt.runtime.choice import Backend
from commrt.runtime.environment import rejoining
from commrt.runtime.rendezvous import mpi_world
from commrt.runtime.rendezvous import tcp_store as _tcp_store
from commrt.transports.base import Transport
from commrt.transports.cuda_ipc_connect import init_cuda_ipc
from commrt.transports.shm_connect import shm_transport
from commrt.transports.stand_ins import stand_in


def make_transport(order, launch, rank, world_size, timeout, address, device):
    """(backend, transport): the first of ``order`` that can be made;
    ``address``: (master_addr, master_port). The NCCL module and cuda_ipc's device are
    the real ones unless a test plugged stand-ins in (:mod:`commrt.transports.stand_ins`)."""
    master_addr, master_port = address
    if rejoining():
        return order[0], _rejoined(order[0], rank, world_size)
    if order[0] is Backend.NCCL:
        made = _nccl_transport(
            launch, rank, world_size, master_addr, master_port, timeout, device,
            stand_in("nccl"),
        )  # fmt: skip
        return Backend.NCCL, made
    if order[0] is Backend.CUDA_IPC:
        store = _tcp_store(launch, rank, world_size, master_addr, master_port, timeout)
        return order[0], init_cuda_ipc(
            store, rank, world_size, device, launch.local_rank, timeout, stand_in("cuda_ipc")
        )
    return cpu_transport(
        order,
        lambda: _tcp_store(launch, rank, world_size, master_addr, master_port, timeout),
        lambda: _mpi_transport(rank, world_size),
        rank, world_size, timeout, "backend='shm'",
    )  # fmt: skip


def cpu_transport(order, store, mpi, rank: int, world_size: int, timeout: float, asked: str):
    """(backend, transport): the first CPU transport of ``order`` that can be made.
    ``store()`` gives the store shared memory and gloo meet through (asked for once, and
    only by them), ``mpi()`` MPI's transport. Shared memory in a longer order may find,
    on every rank alike, that the ranks cannot share it: then the next is made; asked for
    alone (``asked`` says how), that is a ValueError."""
    if tuple(order) == (Backend.SHM,):
        return Backend.SHM, shm_transport(store(), rank, world_size, timeout, asked)
    made_store = None
    for be in order:
        if be is Backend.MPI:
            return be, mpi()
        made_store = store() if made_store is None else made_store
        if be is Backend.SHM:
            from commrt.transports.shm_connect import connect

            made = connect(made_store, rank, world_size, timeout)
            if not isinstance(made, str):
                return be, made
        elif be is Backend.GLOO:
            from commrt.transports.gloo import GlooTransport

            return be, GlooTransport(made_store, rank, world_size, timeout)
    raise ValueError(f"commrt: none of {', '.join(map(str, order))} moves CPU tensors")


def _mpi_transport(rank: int, world_size: int) -> Transport:
    """The MPI transport over MPI's world, which must number the ranks as init does."""
    from commrt.transports.mpi import MpiTransport

    world = mpi_world()
    if world.Get_size() != world_size or world.Get_rank() != rank:
        raise ValueError(
            f"the mpi backend takes rank and size from MPI (rank {world.Get_rank()} "
            f"of {world.Get_size()}), not rank {rank} of {world_size}; launch with "
            f"mpiexec -n {world_size}"
        )
    return MpiTransport(world)


def _rejoined(be: Backend, rank: int, world_size: int) -> Transport:
    """The transport of a replacement that rejoins a running job (``COMMRT_REJOIN=1``);
    backup workers' policy checks that the job's store outlives every rank."""
    from commrt.transports.gloo import GlooRejoined

    if not be.takes_a_replacement:
        raise ValueError(
            f"{settings.REJOIN.name}=1: only the gloo backend lets a replacement rejoin a "
            f"running job (backup workers), not {be}; pass backend='gloo'"
        )
    return GlooRejoined(rank, world_size)


def _nccl_transport(launch, rank, world_size, master_addr, master_port, timeout, device, nccl):
    """The NCCL transport (:mod:`commrt.transports.nccl_bootstrap`); the unique id travels
    over MPI under mpiexec without a port, else through the TCPStore."""
    from commrt.transports.nccl_bootstrap import init_nccl

    over_mpi = launch.launcher == "mpiexec" and master_port is None and launch.master_port is None
    return init_nccl(
        rank,
        world_size,
        launch.local_rank,
        device,
        nccl,
        mpi_world=mpi_world() if over_mpi else None,
        make_store=lambda: _tcp_store(launch, rank, world_size, master_addr, master_port, timeout),
        timeout=timeout,
    )
