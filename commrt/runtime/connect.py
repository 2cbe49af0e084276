"""Making the transport ``commrt.init`` chose: the first of its candidates whose row
(:data:`commrt.runtime.choice.ORDER`) makes one here (:func:`make_transport`; the torch
backend's groups call :func:`first_made` with meetings of their own), MPI's over MPI's
world, and a replacement's that rejoins a running job. The communicator stands on what
this returns."""

from __future__ import annotations

import functools
from dataclasses import replace

from commrt import settings
from commrt.process.environment import rejoining
from commrt.process.rendezvous import mpi_world
from commrt.process.rendezvous import tcp_store as _tcp_store
from commrt.runtime.choice import Backend, Meeting
from commrt.transports.base import Transport


def make_transport(order, launch, rank, world_size, timeout, address, device):
    """(backend, transport): the first of ``order`` that can be made;
    ``address``: (master_addr, master_port). The NCCL module and cuda_ipc's device are
    the real ones unless a test plugged stand-ins in (:mod:`commrt.transports.stand_ins`)."""
    master_addr, master_port = address
    replacing = rejoining()
    if replacing:
        order = _takes_a_replacement(order[0])
    over_mpi = launch.launcher == "mpiexec" and master_port is None and launch.master_port is None
    meeting = Meeting(
        rank,
        world_size,
        timeout,
        lambda: _tcp_store(launch, rank, world_size, master_addr, master_port, timeout),
        lambda: _mpi_transport(rank, world_size),
        launch.local_rank,
        device,
        nccl_id_over_mpi=over_mpi,
        rejoining=replacing,
    )
    return first_made(order, meeting, "backend='shm'")


def first_made(order, meeting: Meeting, asked: str) -> tuple[Backend, Transport]:
    """(backend, transport): the first of ``order`` whose row makes a transport from
    ``meeting`` (its store made at most once, by the first row that asks). A row may find,
    on every rank alike, that these ranks cannot use it (shared memory, across hosts):
    then the next is made; asked for alone (``asked`` says how), that is a ValueError that
    says why."""
    meeting = replace(meeting, store=functools.cache(meeting.store))  # made once, if asked
    declined = []
    for be in order:
        made = be.row.make(meeting)
        if not isinstance(made, str):
            return be, made
        declined.append((be, made))
    if len(declined) == 1:
        raise ValueError(f"commrt: {asked}: {declined[0][1]}; use gloo")
    why = "; ".join(f"{be}: {made}" for be, made in declined)
    raise ValueError(f"commrt: none of {', '.join(map(str, order))} can be made: {why}")


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


def _takes_a_replacement(be: Backend) -> tuple[Backend]:
    """``(be,)``, the one backend a replacement that rejoins a running job
    (``COMMRT_REJOIN=1``) is made on, where it takes one; backup workers' policy checks
    that the job's store outlives every rank."""
    if not be.takes_a_replacement:
        able = " or ".join(f"backend='{b}'" for b in Backend if b.takes_a_replacement)
        raise ValueError(
            f"{settings.REJOIN.name}=1: a replacement cannot rejoin a running job on the "
            f"{be} backend; pass {able} (backup workers)"
        )
    return (be,)
