"""DDP communication hooks that run commrt schedules, on any process-group backend.

Each hook works on a commrt :class:`~commrt.Communicator` of its own (make
one with ``commrt.init()``: under torchrun it meets through the same
MASTER_ADDR/MASTER_PORT store as the process group, under a ``commrt``
prefix), so DDP's process group may be gloo, nccl, mpi or commrt::

    comm = commrt.init(backend="gloo")
    ddp.register_comm_hook(AllReduceState(comm, algorithm="torus2d",
                                          comm_dtype=torch.bfloat16), allreduce_hook)
    ddp.register_comm_hook(GossipState(comm, Gossip(rotate=True)), gossip_hook)

* :func:`allreduce_hook`: the bucket is packed (scaled by 1/p, cast to
  ``comm_dtype``) by commrt's pack kernel, all-reduced by a commrt schedule
  and unpacked back: the average of every rank's gradient.
* :func:`gossip_hook`: GossipGraD inside DDP. At iteration t every bucket is
  mixed with ONE peer, ``Gossip.peers(rank, t, p)`` (the function
  GradientSync's gossip family uses): the gradient becomes ½ own + ½ that
  peer's. The iteration counter advances once per iteration, on the bucket
  for which ``bucket.is_last()``; peers depend on the iteration only, never
  on the bucket index, so DDP's bucket rebuild after the first iteration
  changes nothing. Models drift apart between consensus points: call
  ``commrt.average_parameters(ddp.module, comm)`` for exact agreement;
  ``commrt.data.GossipShuffle`` shuffles samples as with GradientSync.
  Only synchronous gossip fits a hook (DDP writes the hook's result as this
  iteration's gradient); ``Gossip(asynchronous=True)`` needs GradientSync.
* Backup workers cannot be a hook: a late rank skips optimizer steps and
  catches up to the others' parameters and optimizer state, which DDP's
  hook (one bucket's gradient in, one out) cannot express. Use
  ``commrt.GradientSync(model, comm, algorithm=BackupWorkers(...))``.

Hooks run in the autograd thread and return an already-completed future
(the schedule has run when the hook returns); a failure raises from the
hook, which DDP reports as a RuntimeError carrying commrt's named error.
"""

from dataclasses import dataclass, field

import torch

from commrt.algorithms import Gossip, resolve
from commrt.collectives.core import all_reduce
from commrt.kernels import pack, unpack
from commrt.runtime.communicator import Communicator
from commrt.transports.base import average_factor

__all__ = ["AllReduceState", "allreduce_hook", "GossipState", "gossip_hook"]


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


@dataclass
class AllReduceState:
    """State of :func:`allreduce_hook`.

    Hyperparameters: ``comm`` (the commrt communicator), ``algorithm`` (a
    name or instance, as everywhere in commrt), ``comm_dtype`` (the wire
    dtype; None: the gradients' own). Internal: one wire buffer per bucket
    index (re-made when DDP rebuilds its buckets and a size changes).
    """

    comm: Communicator
    algorithm: object = "ring"
    comm_dtype: torch.dtype | None = None
    wires: dict = field(default_factory=dict)

    def wire(self, index: int, like: torch.Tensor) -> torch.Tensor:
        dtype = self.comm_dtype or like.dtype
        w = self.wires.get(index)
        if w is None or w.numel() != like.numel() or w.dtype != dtype:
            w = self.wires[index] = torch.empty(like.numel(), dtype=dtype, device=like.device)
        return w


def allreduce_hook(state: AllReduceState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over every rank through a commrt schedule (module docs)."""
    buf = bucket.buffer()
    p = state.comm.world_size
    if state.comm_dtype is None or state.comm_dtype == buf.dtype:
        all_reduce(buf, state.comm, resolve(state.algorithm), op="avg")
        return _done(buf)
    wire = state.wire(bucket.index(), buf)
    pack([buf], wire, scale=average_factor(p))
    all_reduce(wire, state.comm, resolve(state.algorithm), op="sum")
    unpack(wire, [buf])
    return _done(buf)


@dataclass
class GossipState:
    """State of :func:`gossip_hook`.

    Hyperparameters: ``comm``, ``gossip`` (a synchronous
    :class:`~commrt.algorithms.Gossip`). Internal state: ``step``, the
    iteration whose exchange runs now (advanced on ``bucket.is_last()``).
    Stats: ``mixed`` maps each bucket index to ``(step, recv_from)`` of its
    latest exchange.
    """

    comm: Communicator
    gossip: Gossip = field(default_factory=Gossip)
    step: int = 0
    mixed: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.gossip, Gossip):
            raise TypeError(f"gossip must be a commrt.algorithms.Gossip, got {self.gossip!r}")
        if self.gossip.asynchronous:
            raise ValueError(
                "gossip_hook runs synchronous gossip only: DDP applies a hook's result as "
                "this iteration's gradient; use commrt.GradientSync for Gossip(asynchronous=True)"
            )
        if self.gossip.deadline_s is not None:
            raise ValueError(
                "gossip_hook waits for every partner: DDP applies a hook's result as this "
                "iteration's gradient, so a late message has no later step to land in; use "
                "commrt.GradientSync for Gossip(deadline_s=...)"
            )
        # a hypercube on a p that is not a power of two raises here, on every rank alike
        self.gossip.period_length(self.comm.world_size)


def gossip_hook(state: GossipState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Mix the bucket with this iteration's peer: ½ own + ½ peer's (module docs)."""
    comm, buf = state.comm, bucket.buffer()
    p, step = comm.world_size, state.step
    if p > 1:
        buf.mul_(0.5)
        sched = state.gossip.schedule(p, step=step)
        comm.admit_collective()
        comm.run_schedule(sched, buf, bucket=bucket.index())
    state.mixed[bucket.index()] = (step, state.gossip.peers(comm.rank, step, p)[1])
    if bucket.is_last():
        state.step += 1
    return _done(buf)
