"""What each transport is: one frozen :class:`Traits` value per engine, declared here once.

The transport classes declare theirs from here (``traits = GLOO``), and the backends' rows
(:data:`commrt.runtime.choice.ORDER`) hold the same values, read before any transport is
made: the command line asks whether a backend's ranks are mpiexec's, whether it takes a
replacement, whether it moves CUDA tensors. This module imports nothing, so that asking
costs no import of torch or of an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Traits", "NCCL", "CUDA_IPC", "MPI", "GLOO", "GLOO_REJOINED", "SHM"]


@dataclass(frozen=True)
class Traits:
    """What a transport is, as the layers above ask it: one frozen value that each transport
    class declares (``traits = Traits(...)``) and a wrapper passes on whole
    (:class:`~commrt.transports.base.Forwarding`), so that a path is chosen by what the
    transport does, never by its name (as NCCL asks each transport ``canConnect``). A new
    trait is one field here."""

    #: the engine orders operations on a device stream (NCCL, cuda_ipc): the executor then
    #: enqueues reductions after a receive without a host wait, and only the final
    #: :class:`~commrt.transports.base.Pending` completion is waited on
    stream_ordered: bool = False
    #: a receive can be tested without blocking (MPI, shm): a closing rank's farewell then
    #: travels as a message; elsewhere through the store (commrt.diagnosis.departures)
    pollable: bool = False
    #: a wait whose deadline has already passed only tests the operation (an MPI_Test; shm's
    #: and cuda_ipc's host counters: cuda_ipc issues a receive's copy only once the data was
    #: sent): it neither blocks nor breaks anything, so a waiter may poll, and a message may
    #: stay travelling past a deadline of the caller's (gossip's). NCCL's posted receive
    #: holds its stream until the data comes and cannot be withdrawn
    testable: bool = False
    #: a replacement process that rejoined a running job
    #: (:class:`~commrt.transports.gloo.GlooRejoined`): the job's group does not reach it,
    #: only groups made after it came back do
    rejoined: bool = False
    #: a wait that times out breaks the connection (gloo closes the pair, NCCL aborts the
    #: communicator), so a wait must never be cut into short ones to look at something else
    #: in between
    waits_break_on_timeout: bool = False
    #: the engine moves a message only inside its own calls (MPICH; cuda_ipc's handshakes go
    #: through it): a rank that waits elsewhere must test its sends now and then, or they
    #: never leave (backup workers' catch-up server does)
    progress_in_calls: bool = False
    #: a reduction that failed because a rank died can be redone among the survivors on
    #: groups made afresh (gloo): backup workers' recovery needs it, and elsewhere raises the
    #: failure instead
    survives_peer_death: bool = False
    #: the ranks met through MPI's world rather than a store (mpi): what they agree on
    #: outside the transport (the stall watch's store, hosted by rank 0) is set up through
    #: MPI, and mpiexec must start them
    meets_through_mpi: bool = False
    #: a receive can add its data into the destination as it arrives (shm): the executor then
    #: skips the scratch buffer and its add
    #: (:meth:`~commrt.transports.base.Transport.prepare_adding`)
    adds_on_receive: bool = False
    #: :meth:`~commrt.transports.base.Transport.run_whole` runs a one-shot all-reduce whole
    #: (``cuda_ipc``): auto then weighs it
    fuses_one_shot: bool = False
    #: it moves CUDA tensors (and needs a GPU); the others move CPU tensors
    moves_cuda: bool = False
    #: a rank's death ends every rank (the mpich wheel's MPI does), so nothing that must go
    #: on past a dead rank runs on it, and no rank waits on a dead one to close
    one_death_ends_all: bool = False


#: a wait that passes its deadline aborts the communicator (nothing can be cancelled), so a
#: caller must never cut a long wait into short ones: a 0.25 s slice of a catch-up receive
#: whose server sent a little later aborted it
NCCL = Traits(stream_ordered=True, waits_break_on_timeout=True, moves_cuda=True)
#: device work cannot be withdrawn: a wait that times out breaks the transport
CUDA_IPC = Traits(
    stream_ordered=True,
    testable=True,
    progress_in_calls=True,
    waits_break_on_timeout=True,
    fuses_one_shot=True,
    moves_cuda=True,
)
MPI = Traits(
    pollable=True,
    testable=True,
    progress_in_calls=True,
    meets_through_mpi=True,
    one_death_ends_all=True,
)
GLOO = Traits(waits_break_on_timeout=True, survives_peer_death=True)
#: a replacement's: gloo's, on a group the job's ranks never reach
GLOO_REJOINED = replace(GLOO, rejoined=True)
SHM = Traits(pollable=True, testable=True, adds_on_receive=True)
