"""The backup-workers policy: arrival, catch-up and liveness wired behind the GradientSync seam.

See :mod:`commrt.sync.backup` for the protocol. The policy keeps the
global step this rank holds and its role in the current step; the parts
(:class:`~commrt.sync.backup.parts.Parts`, made at setup) do the talking: :class:`~commrt.sync.backup.arrival.Arrival` decides who
takes part, :class:`~commrt.sync.backup.catchup.CatchUp` moves snapshots,
:class:`~commrt.sync.backup.liveness.Liveness` knows who is still there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from commrt.algorithms.auto import label
from commrt.errors import CommError
from commrt.sync.backup.arrival import Role
from commrt.sync.backup.ending import drain
from commrt.sync.backup.parts import Parts
from commrt.sync.backup.rejoin import announce
from commrt.sync.backup.serving import span
from commrt.sync.policy import Policy, SyncContext
from commrt.sync.report import render_rows


@dataclass
class BackupReport:
    """What backup workers did, as seen from one rank (``sync.policy.report()``).

    ``dropped`` and ``updates`` are per rank, filled in for every rank that
    reached the final state (after ``close()``); ``missing`` are ranks that
    never did (dead, or gone silent for ``dead_after_s``).
    """

    rank: int
    world_size: int
    backups: int
    global_step: int
    final_step: int | None
    dropped: dict[int, int] = field(default_factory=dict)
    updates: dict[int, int] = field(default_factory=dict)
    missing: tuple[int, ...] = ()
    served: int = 0
    #: seconds ``close()`` spent ending training and waiting for the others to hold the end
    drain_s: float = 0.0

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows for a summary table."""
        n, p = self.world_size - self.backups, self.world_size
        dropped = ", ".join(f"r{k} {d}" for k, d in sorted(self.dropped.items()))
        return [
            ("backup workers", f"first {n} of {p} gradients per step (b = {self.backups})"),
            ("global steps", f"{self.global_step}"),
            ("dropped gradients", dropped),
            ("missing ranks", ", ".join(map(str, self.missing)) or "none"),
            ("drain at close", f"{self.drain_s:.2f} s"),
        ]

    def __str__(self) -> str:
        return render_rows(self.rows())

    @classmethod
    def of(
        cls, policy: "BackupPolicy", fins: dict[int, dict], missing, drain_s: float = 0.0
    ) -> "BackupReport":
        """``policy``'s report, with what ranks that reached the end said (``fins``)."""
        per_rank = sorted(fins.items())
        return cls(
            policy.rank,
            policy.p,
            policy.algorithm.backups,
            policy.held,
            policy.final,
            {r: f["dropped"] for r, f in per_rank},
            {r: f["updates"] for r, f in per_rank},
            tuple(sorted(missing)),
            policy.parts.catchup.server.served,
            drain_s,
        )


class BackupPolicy(Policy):
    """The backup-workers family (see :mod:`commrt.sync.backup` for the protocol)."""

    #: ranks may die or fall behind while the others go on (sync.report() tells tools)
    ranks_may_fail = True
    can_rejoin = True  # a replacement of a dead rank joins (commrt.sync.backup.rejoin)

    def __init__(self, algorithm):
        super().__init__(algorithm)
        silent = f"≤ {algorithm.dead_after_s:g} s for silent ones"
        self.closing = f"draining: live ranks agree on the last global step ({silent})"
        # ---- options
        #: start catch-up sends only once the late rank has posted its receive (stream-ordered
        #: transports need this; None: decided by the transport at setup; tests set it to run
        #: that path on MPI)
        self.send_when_ready: bool | None = None
        # ---- fixed at setup
        self.ctx: SyncContext | None = None
        self.rank, self.p = 0, 1  # this rank and the world size
        self.n = 0  # N: the gradients each global step takes (p - b)
        self.timeout = 0.0  # seconds any wait may take (the communicator's)
        self.parts: Parts | None = None  # the store, arrival, catch-up, liveness, reduction
        # ---- where this rank stands
        self.held = 0  # the global step this rank's state holds
        self.final: int | None = None  # the global step training ends at, once known
        self.role = Role.ON_TIME  # this rank's part in the current step
        self.ranks: tuple[int, ...] = ()  # the current step's participants
        self._req: int | None = None  # this step's catch-up request (late only)
        self._opt = None  # the optimizer of the last sync.step (snapshots)
        self._unapplied = False  # a step began and sync.step has not applied it yet
        self.failed = False  # a wait timed out or NCCL failed: close() does not drain
        self._closed = self._said_final = False  # closed; said it holds the final state
        # ---- stats
        self.dropped = 0  # this rank's gradients that came late
        self.updates = 0  # global updates this rank's state went through
        self._report: BackupReport | None = None  # the complete report, after close()

    def setup(self, ctx: SyncContext) -> tuple[str, ...]:
        self.ctx, comm, alg = ctx, ctx.comm, self.algorithm
        self.rank, self.p = comm.rank, comm.world_size
        self.n = alg.participants(self.p)  # ValueError on every rank when p <= b
        self.timeout, rejoined = comm.timeout, comm.transport.traits.rejoined
        if self.send_when_ready is None:
            self.send_when_ready = bool(comm.transport.traits.stream_ordered)
        self.parts = parts = Parts.wire(ctx, alg, self.n)
        if rejoined:
            announce(parts.store, self.rank, parts.incarnation, self.p)
            self.role = Role.JOINING
        parts.reduction.setup(rejoined)
        return tuple(f"backup(b={alg.backups}):{label(a)}" for a in parts.inner)

    # ------------------------------------------------------------ per step
    def begin_step(self, step: int) -> None:
        try:
            self._begin()
        except BaseException:
            self.failed = True
            raise

    def _begin(self) -> None:
        if self._unapplied:
            raise RuntimeError(
                "commrt: backup workers need sync.step(optimizer) after every "
                "backward (a late rank loads the latest parameters and optimizer "
                "state there); sync.wait() followed by optimizer.step() cannot"
            )
        g = self.held
        if self.role is Role.JOINING:  # a replacement's first step: its gradient is dropped
            self._unapplied, self._req = True, self.parts.catchup.request(-1)  # any state will do
            return
        if self.final is not None and g >= self.final:
            self.role, self.ranks = Role.FINAL, ()
            return
        self.parts.liveness.check_alive()  # a rank the others called dead takes no ticket
        self._unapplied = True
        with span(self.ctx.tracer, "commrt/backup/arrive", step=g):
            self.role, self.ranks, names = self.parts.arrival.arrive(g, self.serve)
        if self.role is Role.FINAL:
            self.final = g
            return
        self.parts.reduction.begin(g, self.ranks, self.role is Role.ON_TIME, names)
        if self.role is Role.LATE:
            self.dropped += 1
            self._req = self.parts.catchup.request(g)

    def scale(self, step: int) -> float:
        return 1.0 / self.n

    def communicate(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        if self.role in (Role.FINAL, Role.JOINING):
            return 0
        # a late gradient is dropped: nothing goes on the wire (it is kept in case of a redo)
        on_time, reduction = self.role is Role.ON_TIME, self.parts.reduction
        sent = reduction.run(bucket, buf) if on_time else reduction.keep(bucket, buf)
        if bucket == len(self.ctx.buffers) - 1:  # the step commits (redone if one failed)
            with _marks_failure(self):
                took_part = reduction.commit(on_time, self.serve, self._joined)
            self.role = Role.ON_TIME if took_part else Role.LATE
            self.ranks = self.parts.reduction.ranks
        return sent

    def apply(self, optimizer: torch.optim.Optimizer) -> int:
        self._opt = optimizer
        self._unapplied = False
        if self.role is Role.ON_TIME:
            optimizer.step()
            self.parts.catchup.record_state()
            self.held += 1
            self.updates += 1
            self.serve()
            return 1
        if self.role in (Role.LATE, Role.JOINING):
            req, self._req, self.role = self._req, None, Role.LATE
            with span(self.ctx.tracer, "commrt/backup/catch-up", step=self.held):
                return self.catch_up(req)
        self.say_final()
        self.serve()
        return 0

    def _joined(self, taking_part: bool) -> None:
        """A redo round changed this rank's part in the step: withdraw or post its request."""
        self.dropped += -1 if taking_part else 1
        catchup, req = self.parts.catchup, self._req
        self._req = catchup.withdraw(req) if taking_part else catchup.request(self.held)

    def catch_up(self, req: int) -> int:
        """Receive the snapshot answering ``req``; return the global updates it brought."""
        with _marks_failure(self):  # a timeout, or NCCL's receive that cannot be retried
            resp = self.parts.catchup.receive(req, self.held, self._opt)
        gained = resp["step"] - self.held
        self.held = resp["step"]
        self.updates += gained
        if resp["final"] is not None:
            self.final = resp["final"]
        if self.finished:
            self.say_final()
        return gained

    def serve(self) -> None:
        """Answer the catch-up requests waiting for this rank's state."""
        with _marks_failure(self):  # a snapshot send that timed out on NCCL
            self.parts.catchup.server.serve(
                self._opt, self.held, self.final, not self.send_when_ready
            )

    def step_stats(self) -> dict:
        return {
            "role": self.role.value,
            "participants": list(self.ranks),
            "dropped": self.dropped,
            "global_step": self.held,
            "missing": sorted(self.parts.liveness.missing),
            **self.parts.reduction.stats(self.role is not Role.FINAL),
        }

    @property
    def global_step(self) -> int:
        return self.held

    @property
    def finished(self) -> bool:
        """Training has ended (a rank closed) and this rank holds the final state:
        further steps are no-ops, so a loop may stop."""
        return self.final is not None and self.held >= self.final

    @property
    def extra_bytes(self) -> int:
        return self.parts.catchup.held_bytes + self.parts.reduction.kept_bytes

    # ------------------------------------------------------------ the end (backup.ending)
    def counts(self) -> dict:
        """This rank's numbers, as it reports them when it holds the final state."""
        return {"step": self.held, "dropped": self.dropped, "updates": self.updates}

    def say_final(self) -> None:
        """Tell the others (once) that this rank holds the final state, with its counts."""
        if not self._said_final:
            self._said_final = True
            self.parts.liveness.hold_final(self.counts())

    def close(self) -> None:
        if self._closed or self.parts is None:  # closed already, or never set up
            return
        self._closed = True
        try:
            if not self.failed:
                self.parts.liveness.check_alive()  # the others stopped waiting for it: no drain
                fins, missing, drained_s = drain(self)
                self._report = BackupReport.of(self, fins, missing, drained_s)
        finally:
            self.parts.close()

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        return self.report().missing

    def summary(self) -> list[tuple[str, str]]:
        return self.report().rows()

    def report(self) -> BackupReport:
        """What happened (complete after ``close()``; before, this rank's numbers only)."""
        if self._report is not None:
            return self._report
        return BackupReport.of(self, {self.rank: self.counts()}, tuple(self.parts.liveness.missing))


@contextlib.contextmanager
def _marks_failure(policy: BackupPolicy):
    """A CommError inside marks ``policy`` failed (its close() then does not drain)."""
    try:
        yield
    except CommError:
        policy.failed = True
        raise
