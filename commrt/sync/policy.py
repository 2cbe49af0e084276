"""The seam between :class:`~commrt.GradientSync` and an algorithm family.

GradientSync owns what every family shares: hooks, buckets and their
buffers, the progress thread and its strict bucket order, ``wait`` /
``step`` / ``no_sync``, unused parameters, timeouts, stats and traces. A
:class:`Policy` decides what happens to a packed bucket at training step
``t``. All hooks but :meth:`Policy.apply` run on the progress thread, in the
same order on every rank::

    setup(ctx)                       once, collectively, at construction
    join()                           at sync.join(): the per-step count of
                                     ranks still training (or ValueError)
    per step t:
        begin_step(t)                before bucket 0 of step t leaves
        scale(t)                     the factor the pack pass applies
        communicate(t, b, buf)       per bucket, in bucket order
        ... wait() returns ...
        after_step(t)                work that may outlive wait(): it runs
                                     while the caller computes step t+1
    apply(optimizer)                 in sync.step(), on the caller's thread
    close()                          drain, at sync.close()

What a tool may ask of any family, through ``sync.report()``
(:class:`~commrt.sync.report.SyncReport`), has defaults here that fit the
all-reduce family: :attr:`Policy.ranks_may_fail`, :attr:`Policy.models_drift`,
:attr:`Policy.finished`, :attr:`Policy.missing_ranks` and :meth:`Policy.summary`.

An all-reduce family scales by 1/p and runs one schedule per bucket
(:mod:`commrt.sync.allreduce`); a gossip family scales by 1/2 and picks this
step's peer; a backup-worker family decides in ``begin_step`` who takes
part. Which policy serves an algorithm is decided by
:func:`commrt.sync.families.policy_for`: an algorithm may return its own
from ``sync_policy()``, otherwise its ``family`` names one (both declared on
:class:`~commrt.algorithms.Algorithm`).

Example (a family that sums instead of averaging)::

    class Sum(commrt.sync.Policy):
        def setup(self, ctx):
            self.ctx = ctx
            self.schedules = [self.algorithm.schedule(ctx.comm.world_size) for _ in ctx.buckets]
            return tuple(s.name for s in self.schedules)

        def communicate(self, step, bucket, buf):
            return self.ctx.run(self.schedules[bucket], buf, bucket)
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commrt.runtime.communicator import Communicator
from commrt.sync import buffers
from commrt.sync.buckets import Bucket


@dataclass(frozen=True, eq=False)
class SyncContext:
    """What a policy may use: the communicator, the buckets and a way to run schedules.

    ``buffers[b]`` is bucket ``b``'s flat wire buffer (``comm_dtype``); the
    gradients of that bucket are packed into it before
    :meth:`Policy.communicate` and unpacked from it after.
    """

    comm: Communicator
    buckets: tuple[Bucket, ...]
    buffers: tuple[torch.Tensor, ...]
    comm_dtype: torch.dtype
    tracer: object = None  # commrt.runtime.trace.Tracer or None
    #: ``unpack(b)`` makes bucket b's ``.grad`` hold what its buffer holds again, for a policy
    #: that rewrites buffers after their ``communicate`` (backup workers redoing a step)
    unpack: Callable[[int], None] | None = None

    @property
    def element_size(self) -> int:
        return self.buffers[0].element_size()

    def run(
        self,
        schedule,
        buf: torch.Tensor,
        bucket: int | None = None,
        *,
        reused: bool = True,
        transport=None,
    ) -> int:
        """Run ``schedule`` in place on ``buf`` with the communicator's timeout,
        pieces and tracer; return the bytes this rank sent. Errors name the
        rank, peer, algorithm, step and ``bucket``. ``reused=False`` for a
        schedule run only a few times (a new one every few steps): its
        binding to ``buf`` then just ages out of the executor's small cache
        instead of being kept for as long as ``buf`` lives. ``transport``: a
        transport the policy made itself (its ranks numbered as the schedule
        numbers them) instead of the communicator's."""
        return self.comm.run_schedule(
            schedule,
            buf,
            bucket=bucket,
            tracer=self.tracer,
            owner=buf if reused else None,
            transport=transport,
            spin=False,
        )

    def warm(self, schedule, buf: torch.Tensor, ranks=None) -> None:
        """Launch ``schedule``'s reduce kernel on every piece size it will use on ``buf``,
        where kernels compile on first launch (CUDA), so that the first backward does not
        compile them on the progress thread. ``ranks``: the ranks of ``schedule`` whose pieces
        to warm (default: this rank), for a policy whose rank's place in the schedule
        changes from step to step. Nothing happens on the CPU."""
        if buffers.needs_tuning(buf.device):
            comm = self.comm
            with comm.lock:
                for rank in (comm.rank,) if ranks is None else ranks:
                    comm.executor.warm(schedule, rank, buf, comm.piece_bytes)


class Policy(abc.ABC):
    """One algorithm family's treatment of gradient buckets (see the module docs).

    Subclasses get the algorithm instance as ``self.algorithm``; every hook
    but :meth:`communicate` has a default that does nothing special.
    """

    # -- traits a tool reads through sync.report(), whatever the family
    #: ranks may die or run at their own pace while the others go on, so nothing may wait
    #: on all of them (evaluation stays local; a summary is one rank's view)
    ranks_may_fail: bool = False
    #: the ranks' models differ between consensus points (average_parameters agrees them)
    models_drift: bool = False
    #: what ``close()`` does that may take a while, for a tool to say before it calls it
    #: ("" when it returns at once)
    closing: str = ""
    #: a replacement process may join a running job with it (``COMMRT_REJOIN=1``): its
    #: GradientSync then skips the construction's collectives (the layout check, rank 0's
    #: weights), which the others are long past, and the policy brings the state instead
    can_rejoin: bool = False

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def setup(self, ctx: SyncContext) -> tuple[str, ...]:
        """Prepare for ``ctx.buckets``; return one label per bucket for stats and
        traces (for example the schedule chosen for it). Called collectively,
        in the same order on every rank, so a policy may communicate here."""
        self.ctx = ctx
        return tuple(self.algorithm.name for _ in ctx.buckets)

    def begin_step(self, step: int) -> None:
        """A decision made once per step, before its first bucket leaves."""

    def scale(self, step: int) -> float:
        """The factor applied to the gradients in the pack pass (1/p for an average)."""
        return 1.0

    @abc.abstractmethod
    def communicate(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        """Bucket ``bucket`` of step ``step`` is packed (and scaled) in ``buf``.

        On return ``buf`` must hold what the optimizer should apply for these
        parameters. Returns the bytes this rank sent.
        """

    def join(self):
        """Prepare for ranks that run out of data (``GradientSync.join``): return the
        :class:`~commrt.sync.join.JoinCount` this family keeps per step, and average over
        the ranks still training while it is on. Raise ValueError, saying why, where the
        family cannot shadow finished ranks' steps (the default)."""
        if self.ranks_may_fail:
            why = (
                "this family already tolerates missing ranks by design: nothing waits on "
                "every rank, so a rank that runs out of data simply stops (sync.close()) "
                "and the others go on without it"
            )
        else:
            why = "its policy does not count the ranks still training"
        raise ValueError(
            f"commrt: GradientSync.join() does not apply to algorithm "
            f"{self.algorithm.name} ({type(self).__name__}): {why}"
        )

    def after_step(self, step: int) -> int:
        """Work that continues after ``wait()`` has returned for ``step`` (it
        must not touch the bucket buffers: backward of step+1 writes there).
        Runs before step+1's first bucket and before any other collective on
        the communicator. Returns the bytes this rank sent."""
        return 0

    def apply(self, optimizer: torch.optim.Optimizer) -> int:
        """Apply the synchronised gradients; return how many updates were applied."""
        optimizer.step()
        return 1

    @property
    def global_step(self) -> int | None:
        """The global step this rank's parameters hold, for families where that is not
        simply the number of updates ``apply`` returned (None: count those)."""
        return None

    @property
    def finished(self) -> bool:
        """This rank has nothing more to do: further steps are no-ops, so a loop may stop."""
        return False

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """Ranks this one lost (dead, or silent too long): a collective would wait on them."""
        return ()

    def summary(self) -> list[tuple[str, str]]:
        """The family's own (label, value) rows for a summary table (complete after
        ``close()``)."""
        return []

    def step_stats(self) -> dict:
        """Family-specific numbers for the step just finished (merged into
        :attr:`StepStats.extra <commrt.sync.stats.StepStats.extra>`)."""
        return {}

    @property
    def extra_bytes(self) -> int:
        """Memory this policy holds beyond the bucket buffers (for stats)."""
        return 0

    def close(self) -> None:
        """Finish or cancel work still in flight; called once by ``GradientSync.close``."""
