"""The parts a backup policy talks through, made together at setup.

:class:`Parts` is what :class:`~commrt.sync.backup.policy.BackupPolicy` owns
besides where this rank stands: the control store and this policy's key
space in it, the participants' all-reduce per bucket, and the four parts
that do the talking (:class:`~commrt.sync.backup.arrival.Arrival`,
:class:`~commrt.sync.backup.catchup.CatchUp`,
:class:`~commrt.sync.backup.liveness.Liveness`,
:class:`~commrt.sync.backup.recovery.Reduction`). :meth:`Parts.wire` makes
them in the order they depend on each other (a replacement of a dead rank
enters the store first) and :meth:`Parts.close` ends them in reverse.
"""

from __future__ import annotations

from dataclasses import dataclass

from commrt.algorithms.auto import Auto
from commrt.algorithms.torus import Torus2D
from commrt.runtime.store import ControlStore
from commrt.sync.backup.arrival import Arrival
from commrt.sync.backup.catchup import CatchUp
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.liveness import Liveness
from commrt.sync.backup.recovery import Reduction
from commrt.sync.backup.rejoin import check_rejoin, enter
from commrt.sync.buffers import needs_tuning
from commrt.sync.policy import SyncContext
from commrt.tuning.hook_comm import HookComm


@dataclass
class Parts:
    """One backup policy's parts, wired to one communicator (module docs)."""

    #: per bucket: the all-reduce among the N on-time ranks
    inner: list
    #: the job's control store, and this policy's connection to it in its own key space
    cs: ControlStore
    space: str
    store: object
    #: this rank's incarnation: 0, or j >= 1 for the j-th replacement of a dead rank
    incarnation: int
    arrival: Arrival
    catchup: CatchUp
    liveness: Liveness
    #: the participants' all-reduce, commit and redo
    reduction: Reduction

    @classmethod
    def wire(cls, ctx: SyncContext, alg, n: int) -> "Parts":
        """Make every part for ``alg`` on ``ctx``'s communicator, N = ``n`` taking part
        each step; heartbeats start here. A rejoined rank enters the store first."""
        comm = ctx.comm
        rank, p, timeout, rejoined = (
            comm.rank,
            comm.world_size,
            comm.timeout,
            comm.transport.traits.rejoined,
        )
        inner = _inners(ctx, alg, n, rejoined)
        space = _key_space(comm)
        cs = ControlStore.open(comm)
        store = cs.client(space)
        inc = enter(store, rank, alg, timeout) if rejoined else 0
        params = [prm for b in ctx.buckets for prm in b.params]
        arrival = Arrival(store, cs, space, rank, p, n, alg, timeout, inc)
        catchup = CatchUp(comm, store, params, alg, ctx.tracer, inc, (cs, space))
        liveness = Liveness(cs, space, store, rank, p, alg.dead_after_s, timeout, inc)
        liveness.start(comm.stall)
        reduction = Reduction(ctx, cs, space, arrival, liveness, inner, timeout)
        return cls(inner, cs, space, store, inc, arrival, catchup, liveness, reduction)

    def close(self) -> None:
        """Stop the heartbeats, then end the reduction's and the catch-up's threads."""
        self.liveness.stop()
        self.reduction.close()
        self.catchup.close()


def _key_space(comm) -> str:
    """The key space of the next backup policy made on ``comm`` (each gets its own)."""
    instance = comm.slots.backup_instances
    comm.slots.backup_instances = instance + 1
    return Keys.space(instance)


def _inners(ctx: SyncContext, alg, n: int, rejoined: bool) -> list:
    """Per bucket: the all-reduce among the N participants (a shape that does not fit N
    fails here, on every rank), its reduce kernel warmed (:func:`warm`). ``rejoined``: for a
    replacement (no ``auto``)."""
    if rejoined:
        check_rejoin(alg.inner)
    where = HookComm(ctx.comm)  # what auto's choice may ask of the communicator (a probe)
    inner = [inner_for(alg.inner, n, b.numel * ctx.element_size, where) for b in ctx.buckets]
    for a in dict.fromkeys(inner):
        a.schedule(ctx.comm.world_size, tuple(range(n)))
    warm(ctx, inner, ctx.comm.world_size, n)
    return inner


def warm(ctx: SyncContext, inner: list, p: int, n: int) -> None:
    """Launch the reduce kernel on every piece size the participants' all-reduce (``inner``,
    per bucket) sums into each bucket, where kernels compile on their first launch (CUDA):
    at construction, not on the progress thread during the first backward. Which N of the
    p ranks take part changes from step to step, and with it this rank's place among
    them, so the pieces of every place are warmed. Nothing happens on the CPU."""
    if not any(needs_tuning(b.device) for b in ctx.buffers):
        return
    participants = tuple(range(n))
    for a, buf in zip(inner, ctx.buffers):
        ctx.warm(a.schedule(p, participants), buf, ranks=participants)


def inner_for(inner, n: int, nbytes: int, comm):
    """The all-reduce among the N participants for a bucket of ``nbytes``."""
    if isinstance(inner, Auto):  # priced for the N ranks that take part (probes: collective)
        return inner.choose(n, nbytes, comm).algorithm
    if isinstance(inner, Torus2D) and inner.rows is None and inner.cols is None:
        return Torus2D(*inner.shape(n))
    return inner
