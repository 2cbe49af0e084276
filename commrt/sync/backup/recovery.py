"""The participants' reduction of a global step, committed through the store or redone.

**Commit.** On gloo a step's update is applied only once the step has
*committed*: each participant that finished its reduction counts itself
on ``ok/{g}/{k}`` (round k of global step g, the store's atomic ``add``);
the one whose count reaches N proposes the round's outcome ``o/{g}/{k}`` =
``commit`` with the store's ``compare_set``, and every rank (participants
and late ranks) applies or catches up only after reading ``commit`` there.
That closes the window where some participants finished a reduction that
others did not. It costs each rank about three one-key operations per step
(and one poll of one key per wait): O(p) for the job, no rank reads
another's mark.

**Redo.** A participant whose reduction fails (a gloo error from a dead
peer, a :class:`~commrt.CommTimeoutError`) aborts the group it ran on (so
its peers fail at once, :mod:`commrt.sync.backup.wire`) and proposes
``redo``; so does any rank that sees a participant recorded dead
(:mod:`commrt.sync.backup.liveness`), or no outcome within the timeout.
The first proposal written wins: one outcome per round, read by all. On
``redo`` every live rank, late ones included, takes a ticket of round k+1
of the same global step; its first N are the new participants (so N
gradients are still averaged, found among the live ranks), which restore
their buffers from the packed copies kept at ``communicate`` and run the
inner all-reduce again on a group made for exactly them (the next step
reuses that group when its participants are the same ranks, else makes
its own: one gloo rendezvous, milliseconds on one machine). Whoever is past
ticket N in the round that commits catches up as a late rank. With fewer
than N live ranks (more deaths than backups) the round cannot fill: every
live rank raises :class:`~commrt.CommTimeoutError` naming the missing
ranks, at once when the recorded deaths already show it, else at the
timeout.

**Memory.** Each rank keeps one copy of its bucket buffers (the packed,
scaled gradients before the reduction: one copy of the gradient buffers,
in the wire dtype), allocated once at setup and overwritten every step;
it is what a redo starts from, and is no longer needed once the step
commits.

**A hung participant** (stopped, not dead) keeps its connections open, so
gloo reports nothing to the rank whose receive waits on it; that rank gives
the wait up once the hung one is recorded dead (about ``dead_after_s``:
:mod:`commrt.sync.backup.waiter`), aborts its group, and the step is redone
without it. **Limits.** A death while a round's group is being made costs about
``dead_after_s``: the rendezvous's waits poll and end once a member is
recorded dead (:class:`~commrt.sync.backup.wire.PollingStore`). A
rank inside ``close()`` takes no ticket of a redo round: if the round needs
it to reach N, the others raise the timeout error, naming it. ``wait()``
returns only once the step committed, on late ranks too (they used to
return at once and wait for their snapshot in ``sync.step``). Other
transports (MPI, NCCL) keep the old behaviour: the reduction runs on the
communicator, nothing is kept and a failure is raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from commrt.errors import CommError
from commrt.process.polling import poll
from commrt.sync.backup.keys import Keys, rank_of
from commrt.sync.backup.wire import Wire, make_wire
from commrt.transports.base import Transport

COMMIT, REDO = "commit", "redo"


class Reduction:
    """This rank's part in each global step's all-reduce among its participants, and its redo."""

    def __init__(self, ctx, cs, space: str, arrival, liveness, inner: list, timeout: float):
        # ---- fixed at setup
        self.ctx, self.cs, self.space = ctx, cs, space
        self.store = arrival.store  # the policy's connection
        self.arrival, self.liveness, self.inner = arrival, liveness, inner
        self.rank, self.p, self.n, self.timeout = arrival.rank, arrival.p, arrival.n, timeout
        #: a failure is redone (gloo); elsewhere it is raised, as before
        self.recoverable = ctx.comm.transport.traits.survives_peer_death
        #: the seam for fault injection (gloo): ``wrap_round(transport, step, round)`` returns
        #: the transport round ``round`` of global step ``step`` reduces on, in place of its
        #: group's own; None: the group's. The tests wrap it to die inside an all-reduce.
        self.wrap_round: Callable[[Transport, int, int], Transport] | None = None
        # ---- the groups reductions run on (gloo)
        self.setup_wire: Wire | None = None  # every rank's, made at setup, until it fails
        self.broken = False  # the setup group failed somewhere (read from the store)
        self.wire: Wire | None = None  # the group of the current round
        #: the group of the round that committed at global step ``last_step`` with this rank
        #: taking part (never the setup group): the next step's participants reuse it when
        #: they are exactly its members (then each of them holds it: module docs)
        self.last: Wire | None = None
        self.last_step = -1
        self.groups_made = 0  # groups made for a round's participants (stats)
        #: per bucket: the packed gradients before the reduction (what a redo starts from)
        self.kept: list[torch.Tensor] = []
        # ---- the current global step
        self.step, self.round = 0, 0  # the global step and its redo round (0: first try)
        self.ranks: tuple[int, ...] = ()  # the round's participants
        self.names: tuple[str, ...] = ()  # their ticket names (incarnations told apart)
        self.schedules: list = []  # per bucket: the inner all-reduce among them
        self.error: BaseException | None = None  # this rank's reduction failed this round

    def setup(self, rejoined: bool = False) -> None:
        """Collective: the group of every rank, and the buffers' copies (gloo only).
        ``rejoined``: this rank is a replacement (not collective; the job set ``broken``
        when it came back, so no step it takes part in runs on the setup group)."""
        if self.recoverable and rejoined:
            self.broken = True
            self.kept = [torch.empty_like(b) for b in self.ctx.buffers]
        elif self.recoverable:  # its waits end once a member of the round is recorded dead
            args = (None, 0, range(self.p), self.rank, self.timeout, (), self._member_died)
            self.setup_wire = make_wire(self.cs, self.space, *args)
            self.kept = [torch.empty_like(b) for b in self.ctx.buffers]

    def stats(self, took_step: bool) -> dict:
        """The step's redo rounds (``took_step``: this rank took part in it, or was late),
        and the groups made so far."""
        return {"redone": self.round if took_step else 0, "groups_made": self.groups_made}

    @property
    def kept_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kept)

    # ------------------------------------------------------------ the first try
    def begin(self, step: int, ranks: tuple[int, ...], participant: bool, names=()) -> None:
        """Global step ``step`` begins with ``ranks`` taking part (this rank among them, or
        late; ``names``: their ticket names)."""
        self.step, self.round, self.ranks, self.error = step, 0, ranks, None
        self.names = tuple(names)
        if participant:
            self._use_wire()

    def _use_wire(self) -> None:
        """The group and schedules for this round's participants."""
        if not self.recoverable:
            self.schedules = [a.schedule(self.p, self.ranks) for a in self.inner]
            return
        if self.round == 0 and not self._is_broken():
            self.wire = self.setup_wire
        elif self.round == 0 and self._last_fits():
            self.wire = self.last
        else:
            self._release()
            try:
                self.wire = make_wire(
                    self.cs,
                    self.space,
                    self.step,
                    self.round,
                    self.ranks,
                    self.rank,
                    self.timeout,
                    self.names,
                    self._member_died,
                )
            except RuntimeError as e:  # a participant died before it joined: redo
                self.wire, self.error = None, e
                return
            self.groups_made += 1
        self.schedules = self.wire.schedules(self.inner, self.ranks)

    def _member_died(self) -> bool:
        """A member of the current round was recorded dead (its group would never meet, nor
        would the round commit): the incarnation that took the ticket, not an earlier one
        whose replacement's return this rank has not read yet (it would give up a group the
        others still make), and also when its death and its replacement's return were read in
        one beat (:meth:`~commrt.sync.backup.liveness.Liveness.recorded_dead`)."""
        return any(map(self.liveness.recorded_dead, self.names))

    def _last_fits(self) -> bool:
        """The previous step committed on a group of exactly this step's participants: all
        of them took part in it, so all of them hold it and reuse it too (the names tell a
        replacement from the rank it replaced, whose group it does not hold)."""
        last = self.last
        return (
            last is not None
            and self.last_step == self.step - 1
            and last.names == self.names
            and not last.failed
        )

    def _release(self) -> None:
        """Close the group of an earlier round before another is made (not the setup one)."""
        if self.wire is not None and self.wire is not self.setup_wire:
            self.wire.transport.close()
        if self.last is self.wire:
            self.last = None
        self.wire = None

    def _is_broken(self) -> bool:
        if not self.broken and self.store.check([Keys.BROKEN]):
            self.broken = True
            if self.setup_wire is not None and not self.setup_wire.failed:
                self.setup_wire.abort()  # its peer died: its connections are not reused
        return self.broken

    def keep(self, bucket: int, buf: torch.Tensor) -> int:
        """Copy bucket ``bucket``'s packed gradients (a late rank may be needed in a redo);
        return 0, the bytes a late rank sends."""
        if self.kept:
            self.kept[bucket].copy_(buf)
        return 0

    def run(self, bucket: int, buf: torch.Tensor) -> int:
        """All-reduce bucket ``bucket`` among the participants; return the bytes sent. On gloo
        a failure is recorded (and the group aborted) instead of raised: :meth:`commit` redoes
        the step."""
        self.keep(bucket, buf)
        if not self.recoverable:
            return self.ctx.run(self.schedules[bucket], buf, bucket)
        if self.error is not None:
            return 0  # the round failed already: commit() redoes every bucket
        wire = self.wire
        transport = wire.transport
        if self.wrap_round is not None:
            transport = self.wrap_round(transport, self.step, self.round)
        try:
            return self.ctx.run(
                self.schedules[bucket],
                buf,
                bucket,
                reused=wire is self.setup_wire and transport is wire.transport,
                transport=transport,
            )
        except (CommError, RuntimeError) as e:
            self.error = e
            wire.abort()
            return 0

    # ------------------------------------------------------------ commit or redo
    def commit(
        self, participant: bool, idle: Callable[[], None], joined: Callable[[bool], None]
    ) -> bool:
        """Wait until this step commits, redoing it as often as it takes; return whether
        this rank took part in the round that committed (it then applies the update; else it
        catches up). ``idle()`` runs while it waits; ``joined(taking_part)`` is called when
        this rank's part changes in a redo round."""
        if not self.recoverable:
            return participant
        while True:
            if participant and self.error is None:
                finished = int(self.store.add(Keys.done(self.step, self.round), 1))
                if finished == len(self.ranks):
                    self._decide(COMMIT)
            elif participant:
                self._decide(REDO)
            if self._outcome(idle) == COMMIT:
                if participant and self.wire is not self.setup_wire:
                    self.last, self.last_step = self.wire, self.step
                break
            was = participant
            participant = self._redo_round(idle)
            if participant != was:
                joined(participant)
        if participant and self.round > 0:  # the buffers were rewritten by the redo (the
            for b in range(len(self.ctx.buffers) - 1):  # last one is unpacked after this)
                self.ctx.unpack(b)
        return participant

    def _outcome(self, idle: Callable[[], None]) -> str:
        """The outcome of the current round (waits for it, or decides it)."""
        key = Keys.outcome(self.step, self.round)

        def decided() -> bool:  # or a participant died: then nobody may ever decide
            return self.store.check([key]) or self._member_died()

        if poll(decided, self.timeout, idle) and self.store.check([key]):
            return self.store.get(key).decode()
        return self._decide(REDO)  # a participant died, or none answered in time

    def _decide(self, outcome: str) -> str:
        """Propose ``outcome`` for the current round; return the one that won."""
        if outcome == REDO:  # before the outcome: no later step may use the setup group
            self.store.set(Keys.BROKEN, "1")
        key = Keys.outcome(self.step, self.round)
        return self.store.compare_set(key, "", outcome).decode()

    def _redo_round(self, idle: Callable[[], None]) -> bool:
        """Take part in the next round of this step; return whether this rank is among its N."""
        self.liveness.check_alive()  # a rank the others called dead takes no ticket
        self.round += 1
        self.error = None
        for kept, buf in zip(self.kept, self.ctx.buffers):
            buf.copy_(kept)  # the packed gradients again
        pos = self.arrival.take(self.step, round=self.round)
        began = time.monotonic()

        def waiting() -> None:
            idle()
            dead = self.liveness.missing
            if self.p - len(dead) < self.n:  # the round can never fill: say so now
                waited = time.monotonic() - began
                raise self.arrival.timeout_error(self.step, self.round, dead, waited)

        names = self.arrival.first_n(self.step, waiting, round=self.round)
        self.ranks = tuple(sorted(rank_of(s) for s in names))
        self.names = tuple(sorted(names))
        if pos > self.n:
            return False
        self._use_wire()
        for b, buf in enumerate(self.ctx.buffers):
            self.run(b, buf)
        return True

    def close(self) -> None:
        for wire in {self.setup_wire, self.wire, self.last} - {None}:
            wire.transport.close()
        self.setup_wire = self.wire = self.last = None
