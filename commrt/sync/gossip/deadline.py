"""Gossip with a deadline: never wait past it for a partner, lose no gradient on the way.

``Gossip(deadline_s=...)`` (seconds, or ``"auto"``: :class:`DeadlineClock`).
At step ``t`` the pack pass scales a bucket by ½, as plain gossip does.
Then, per bucket ``b``:

* **send**: a copy of the bucket (½ own gradient) goes to ``send_to``, and
  the receive of ``recv_from``'s ½ is posted, both tagged with (t, b)
  (:func:`commrt.schedule.tags.gossip`), so a message that arrives late is
  still matched to its step. Neither is waited on here.
* **wait**: for the message *due* at this step (step t's; step t−1's when
  asynchronous) until the step's deadline, counted from its first bucket,
  never longer.
* **apply**: the bucket keeps its own ½ and adds *every* message that has
  landed and is due (this step's, and any late ones of earlier steps),
  each exactly once. A message still on the wire is applied at the first
  step after it lands. That is push-sum (Kempe et al.; Assran et al.'s SGP)
  with weights ½ kept, ½ pushed: over all ranks the weights of each
  gradient sum to exactly 1, so every gradient reaches the model exactly
  once in total, whatever arrives late.

**What a late message does to the step it lands in**: that step applies
its own ½ gradient plus the late ½ (plus its on-time message, if any): a
larger update, built from gradients ``staleness`` steps old (the step that
applied it minus the step that computed it; 0 when on time, 1 when on time
in asynchronous mode). The step that missed it applied only its own ½ (and
what else landed). Ranks run at their own pace: nothing waits on all ranks.

**Asynchronous** (``asynchronous=True``): the bucket's own ½ of step t is
kept by the policy and applied at step t+1 together with the partner's
message of step t; step 0 applies nothing (as plain asynchronous gossip).

**A partner that died** (its connection broke) leaves this rank's schedule:
``Gossip.peers(..., live=...)`` gives the rank itself instead, and a step
without a partner to send to keeps its whole gradient (no ½ leaves). The
rank that learns of a death writes it in the job's store, where every rank
reads it once per rotation period (:mod:`commrt.sync.gossip.deaths`), so a
dead rank leaves every survivor's schedule within one period.

**At close()** every message still travelling is waited for (bounded by the
communicator's timeout; a dead sender's fail at once): what lands is counted
in the ledger as ``unapplied``, with the asynchronous mode's last own ½.
:class:`~commrt.sync.gossip.ledger.GossipLedger` (``sync.policy.ledger``)
then satisfies, summed over ranks, ``computed == applied + unapplied``
exactly when ``lost == 0``.

**On a device stream** (``cuda_ipc``; ``transport.traits.testable``): a letter
lands once its copies are *issued* on the transport's stream, which the
transport does only after the sender's host posted the piece, so a late
message never holds the stream. Each posting orders the transport's
stream after the caller's writes to its buffers (the exchange's ``begin``),
and every landed buffer is read or reused only after ``end`` ordered the
caller's stream after those copies. A rank whose process died breaks the
transport (device copies cannot be withdrawn), so training on past a death
(above) holds on gloo and MPI. NCCL is refused: its posted receive holds
the stream until the data comes.

**Memory**: one send and one receive buffer per bucket per message in
flight (a straggler's partners hold their messages to it until it takes
them), reused once free.
"""

from __future__ import annotations

import time

import torch

from commrt.schedule import tags
from commrt.sync.gossip.ledger import DeadlineClock, GossipLedger
from commrt.sync.gossip.mail import ARRIVED, FAILED, WAITING, Letter, Postbox
from commrt.sync.gossip.policy import SWAP_ELEMS, swap
from commrt.sync.gossip.rejoin import Members
from commrt.sync.policy import Policy, SyncContext
from commrt.sync.snapshot import load_snapshot, pack_snapshot


class DeadlineGossipPolicy(Policy):
    """Gossip whose waits end at a deadline; late messages applied on landing (module docs)."""

    models_drift = True
    ranks_may_fail = True
    closing = "waiting for the gossip messages still on the wire"
    can_rejoin = True  # a replacement of a dead rank comes back (commrt.sync.gossip.rejoin)

    def setup(self, ctx: SyncContext) -> tuple[str, ...]:
        self.ctx = ctx
        comm = ctx.comm
        alg = self.algorithm
        self.world_size, self.rank = comm.world_size, comm.rank
        alg.period_length(self.world_size)  # a hypercube on a bad p raises on every rank
        if comm.transport.traits.stream_ordered and not comm.transport.traits.testable:
            raise ValueError(
                f"Gossip(deadline_s=...) needs a transport that can leave a message "
                f"travelling (gloo, mpi, shm, cuda_ipc), not {comm.transport.name}: its "
                f"posted receive holds the device stream until the data comes and cannot "
                f"be withdrawn; use Gossip() without a deadline there"
            )
        if len(ctx.buffers) > tags.GOSSIP_BUCKETS:
            raise ValueError(
                f"Gossip(deadline_s=...) takes at most {tags.GOSSIP_BUCKETS} buckets per "
                f"step, got {len(ctx.buffers)}: raise bucket_mb"
            )
        self._scale = 0.5 if self.world_size > 1 else 1.0
        self._lag = 1 if alg.asynchronous else 0
        self.clock = DeadlineClock(alg.deadline_s, comm.timeout)
        self.ledger = GossipLedger(
            unapplied_buckets=[torch.zeros(b.numel(), dtype=torch.float64) for b in ctx.buffers]
        )
        self.postbox = Postbox(comm, comm.timeout)
        self._period = alg.period_length(self.world_size)
        self._params = [p for b in ctx.buckets for p in b.params]
        self._optimizer = None  # the one apply() steps: its state is in a snapshot
        self.members = Members(comm, self.postbox, self._period, self._snapshot)
        #: the step this rank started from (a replacement's: its server's), and the
        #: snapshot it loads at its first apply (optimizer state)
        self._offset, self._pending_state, self._updates = 0, None, 0
        if comm.transport.traits.rejoined:
            self._offset, flat, layout = self.members.rejoin()
            load_snapshot(flat, layout, self._params, None)  # its first gradient's weights
            self._pending_state = (flat, layout)
        self._inbox: list[list[Letter]] = [[] for _ in ctx.buffers]
        self._outbox: list[Letter] = []
        self._spares: list[list[torch.Tensor]] = [[] for _ in ctx.buffers]
        self._kept = self._tmp = None
        if alg.asynchronous:
            self._kept = [torch.zeros_like(b) for b in ctx.buffers]
            largest = max(b.numel() for b in ctx.buffers)
            self._tmp = torch.empty(min(largest, SWAP_ELEMS), dtype=ctx.comm_dtype)
        self._step = -1
        self._due_at = 0.0
        self._late_now = 0
        self._peers = (self.rank, self.rank)
        return tuple(str(alg) for _ in ctx.buckets)

    # -- per step

    def begin_step(self, step: int) -> None:
        step += self._offset  # the job's step (a replacement starts at its server's)
        self._step = step
        self._late_now = 0
        live = self.members.live(step)
        self._peers = self.algorithm.peers(self.rank, step, self.world_size, live)

    def _snapshot(self):
        """This rank's parameters and optimizer state now (served to a replacement)."""
        return pack_snapshot(self._params, self._optimizer)

    def scale(self, step: int) -> float:
        return self._scale

    def communicate(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        step = self._step
        if bucket == 0:
            self._due_at = time.monotonic() + self.clock.seconds()
        self.ledger.computed += float(buf.sum(dtype=torch.float64)) / self._scale
        sent = self._post(step, bucket, buf) if self.world_size > 1 else 0
        if self._kept is not None:
            swap(buf, self._kept[bucket], self._tmp)
        self._apply_mail(step, bucket, buf)
        self.ledger.applied += float(buf.sum(dtype=torch.float64))
        self._reclaim_sends()
        return sent

    def _post(self, step: int, bucket: int, buf: torch.Tensor) -> int:
        """Post this bucket's send and receive of ``step``; the bytes sent."""
        send_to, recv_from = self._peers
        send = recv = None
        if send_to != self.rank:
            send = Letter(step, bucket, send_to, self._spare(bucket, buf))
            send.buf.copy_(buf)
        else:  # nobody to push half to: this rank keeps its whole gradient
            buf.mul_(1 / self._scale)
        if recv_from != self.rank:
            recv = Letter(step, bucket, recv_from, self._spare(bucket, buf))
            self._inbox[bucket].append(recv)
        if send is None and recv is None:  # no live partner this step
            return 0
        self.postbox.post(tags.gossip(step, bucket), send, recv)
        if send is None:
            return 0
        self._outbox.append(send)
        self.ledger.sent += 1
        return buf.numel() * buf.element_size()

    def _apply_mail(self, step: int, bucket: int, buf: torch.Tensor) -> None:
        """Wait for the message due now until the deadline, then add every landed one."""
        inbox = self._inbox[bucket]
        for letter in inbox:
            if letter.step + self._lag == step:
                self.postbox.wait(letter, self._due_at)
        keep = []
        for letter in inbox:
            if letter.state == ARRIVED and letter.step + self._lag <= step:
                buf.add_(self._landed(letter))
                self._count_applied(step, letter)
                self._spares[bucket].append(letter.buf)
            elif letter.state == FAILED:
                self.ledger.lost += 1
            else:
                keep.append(letter)
                if letter.step + self._lag <= step:
                    self._late_now += 1
        self._inbox[bucket] = keep

    def _count_applied(self, step: int, letter: Letter) -> None:
        ledger = self.ledger
        ledger.received += 1
        staleness = step - letter.step
        ledger.staleness[staleness] += 1
        if staleness > self._lag:
            ledger.late += 1
        self.clock.observe(letter.latency)

    def _landed(self, letter: Letter) -> torch.Tensor:
        """``letter``'s buffer, with the caller's later work ordered after the transport's
        copies into or out of it (a device stream's, on cuda_ipc; nothing elsewhere): a
        landed letter's copies were all issued before it was marked landed."""
        self.ctx.comm.transport.end(letter.buf)
        return letter.buf

    def _spare(self, bucket: int, like: torch.Tensor) -> torch.Tensor:
        spares = self._spares[bucket]
        return spares.pop() if spares else torch.empty_like(like)

    def _reclaim_sends(self) -> None:
        """Free the buffers of sends that finished; count those whose peer died."""
        still = []
        for letter in self._outbox:
            if letter.state == WAITING:
                still.append(letter)
                continue
            if letter.state == FAILED:
                self.ledger.lost_sends += 1
            self._spares[letter.bucket].append(self._landed(letter))
        self._outbox = still

    def apply(self, optimizer: torch.optim.Optimizer) -> int:
        self._optimizer = optimizer
        if self._pending_state is not None:  # a replacement's first step: its server's state
            load_snapshot(*self._pending_state, self._params, optimizer)
            self._pending_state = None
        if self._kept is not None and self._step == self._offset:
            return 0  # nothing mixed yet: step 0's own half is applied at step 1
        optimizer.step()
        self._updates += 1
        return 1

    @property
    def global_step(self) -> int | None:
        """A replacement's: the step it started from plus its updates (None: count them)."""
        return self._offset + self._updates if self._offset else None

    def step_stats(self) -> dict:
        send, recv = self._peers
        return {
            "gossip_step": self._step,
            "send_to": send,
            "recv_from": recv,
            "deadline_s": self.clock.seconds(),
            "late": self._late_now,
        }

    def summary(self) -> list[tuple[str, str]]:
        led = self.ledger
        stale = ", ".join(f"{k}:{v}" for k, v in sorted(led.staleness.items())) or "-"
        return [
            ("gossip messages", f"{led.sent} sent, {led.received} applied, {led.late} late"),
            ("gossip staleness", f"{stale} (steps:messages)"),
            ("gossip lost", f"{led.lost} received, {led.lost_sends} sent"),
        ] + self._rejoin_rows()

    def _rejoin_rows(self) -> list[tuple[str, str]]:
        m = self.members
        rows = []
        if m.admitted:
            rows.append(("gossip rejoined", f"{m.admitted} admitted, {m.served} served a snapshot"))
        if self._offset:
            rows.append(("gossip rejoined at", f"step {self._offset} (this rank: a replacement)"))
        return rows

    @property
    def deaths(self):
        """The :class:`~commrt.sync.gossip.deaths.DeathBoard` (None on 2 ranks)."""
        return self.members.deaths

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.members.dead))

    @property
    def extra_bytes(self) -> int:
        held = [s for spares in self._spares for s in spares]
        held += [x.buf for x in self._outbox] + [x.buf for box in self._inbox for x in box]
        held += list(self._kept or []) + ([self._tmp] if self._tmp is not None else [])
        return sum(t.numel() * t.element_size() for t in held)

    def close(self) -> None:
        """Wait (bounded) for every message still travelling; hold what lands as unapplied."""
        deadline = time.monotonic() + self.ctx.comm.timeout
        letters = [x for box in self._inbox for x in box]
        self.postbox.wait_all(letters + self._outbox, deadline)
        for bucket, box in enumerate(self._inbox):
            for letter in box:
                if letter.state == ARRIVED:
                    self.ledger.received += 1
                    self.ledger.hold(bucket, self._landed(letter))
                else:
                    self.ledger.lost += 1
            box.clear()
        if self._kept is not None and self._step >= 0:
            for bucket, kept in enumerate(self._kept):
                self.ledger.hold(bucket, kept)
        self._reclaim_sends()
        self.ledger.lost_sends += len(self._outbox)
        self._outbox = []
        self.postbox.close()
        self.members.close()
