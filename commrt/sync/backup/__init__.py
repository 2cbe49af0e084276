"""Backup workers behind the GradientSync seam: first N of N + b gradients per global step.

Every rank holds a *global step* g: the number of global updates its
parameters and optimizer state contain. Ranks agree on each step through
the control store (:mod:`commrt.runtime.store`), nothing else central:

1. **Arrival.** When a rank's first bucket of the step is ready
   (:meth:`BackupPolicy.begin_step`), it takes a ticket with the store's
   atomic ``add`` on the key of step g and writes its rank under that
   ticket. Tickets 1..N are the step's participants; every rank reads the
   same N names, so all agree on who takes part. Arrival is "backward has
   begun producing gradients", so the rest of backward still overlaps the
   all-reduce; a delay that falls after the first bucket is ready is not
   seen.
2. **On time** (ticket <= N): the gradients are scaled by 1/N in the pack
   pass and the inner all-reduce runs over exactly those N ranks
   (``schedule(p, ranks=...)`` on the existing communicator). At
   ``sync.step(optimizer)`` the optimizer steps: the rank now holds g + 1.
3. **Late** (ticket > N): the gradient is dropped (nothing goes on the
   wire), and the rank posts a catch-up request. At ``sync.step`` it
   receives a *snapshot* — parameters and every optimizer state tensor,
   flattened, bit for bit — from an on-time rank and loads it, so it holds
   exactly what the on-time ranks held after the latest global step they
   finished, and computes its next gradient there. ``sync.step`` returns
   the number of global updates that jumped over (0 or more).

**Serving a snapshot costs an on-time rank a copy**, and an on-time rank
serves at most ``max(1, b)`` snapshots at once, each in its own buffer
freed when the receiver confirms: the details are in
:mod:`commrt.sync.backup.catchup`. Nothing else is kept: no history of
gradients.

**Dead ranks.** Up to b ranks that stop between steps never arrive, so the
others still find N arrivals per step and go on. Each rank beats its own
store counter and checks ONE neighbour's (the next live rank in ring
order); a neighbour silent for ``dead_after_s`` (2 s by default) is
recorded dead in the store, and every rank learns it within one more beat
from a death counter it reads each beat (:mod:`commrt.sync.backup.liveness`).
A rank that was only slow and finds itself declared dead raises
:class:`~commrt.sync.backup.liveness.RankDeclaredDeadError` at its next
step or ``close()``. With more than b dead, a step never gets N arrivals
and the waiting ranks raise :class:`~commrt.CommTimeoutError` after the
timeout, naming the ranks that never arrived. A replacement process started
with a dead rank's RANK and ``COMMRT_REJOIN=1`` rejoins the running job
(gloo): it catches up from a snapshot and takes part again, nobody else
restarting (:mod:`commrt.sync.backup.rejoin`).

**Deaths inside a step: commit or redo** (gloo;
:mod:`commrt.sync.backup.recovery`). Each rank keeps a copy of its packed
gradients (one copy of the bucket buffers) until the step commits. The
participants all-reduce on a gloo group the policy owns
(:mod:`commrt.sync.backup.wire`); each that finishes counts itself on the
round's ``ok`` counter, and the step's outcome (``commit`` once it reaches N, ``redo``
when a participant's reduction failed, a participant is recorded dead, or
nothing happened within the timeout) is written once with the store's
``compare_set``: every rank, late ones included, reads the same outcome
before its ``wait()`` returns. A rank whose reduction failed aborts its
group, so its peers fail at once rather than at the timeout. On ``redo``
every live rank takes a ticket of the next round of the *same* global step;
its first N (the survivors and late ranks that kept their gradients)
restore their buffers from the copies and all-reduce again on a group
made for exactly them; the others catch up as late ranks. So no step is
lost or applied twice, N gradients are still averaged, and every live rank
ends bit-identical; raw transport errors never reach the user. With fewer
than N live ranks the round cannot fill, and every live rank raises
:class:`~commrt.CommTimeoutError` naming the missing ranks (as soon as the
recorded deaths show it, at the latest at the timeout). After a first
failure a step runs on a group made for its participants (one gloo
rendezvous, milliseconds on one machine), reused while they stay the same. MPI and NCCL keep the old behaviour: a death inside
the all-reduce fails the step with the usual error.

**Control-plane cost.** Per step a rank makes about seven store round trips
(dead check, ticket, name, polls for the N names, read them, look for
requests): tens to hundreds of microseconds on one machine; but every rank
reads all N names, so the store's work per step grows as p². On gloo the
step's end takes about eight one-key operations per participant (the
commit's setup-group check, ``ok`` count, two polls of the outcome, its
check and read and a look for requests while waiting; then a look after
the update) and five per late rank: O(p). The heartbeats cost the store 3 operations per rank
per beat, O(p) for the job. :mod:`commrt.sim.control` prices arrival, the
commit and heartbeats for p up to 4096 from
``bench/bench_control_plane.py``'s measurements (``commrt simulate``).

**Ending.** The first rank to call ``close()`` ends training at the global
step it holds: it takes a ticket on that step marked "closing", and a step
whose first N tickets include one makes no update. Every rank then ends at
that final state: ``close()`` keeps answering catch-up requests and returns
once every live rank holds it (ranks recorded dead are not waited for, so
a death just before ``close()`` costs about ``dead_after_s``; the wait is
bounded by the timeout). Steps a rank takes after
the end are no-ops that return 0. When rank 0 hosts the store (no launcher
store), its ``close()`` also waits until every live rank has closed.

Requires ``sync.step(optimizer)`` (a late rank must load optimizer state);
``unused="error"``, ``broadcast_buffers=True`` and collectives between steps
involve every rank at once, which backup workers are meant to avoid.

The package, one module per job (imports go down this list, never up):

==========================================  ==========================================
:mod:`~commrt.sync.backup.policy`           :class:`BackupPolicy`, the per-step protocol
:mod:`~commrt.sync.backup.ending`           the end of training: last step, drain
:mod:`~commrt.sync.backup.parts`            the parts, made together at setup
:mod:`~commrt.sync.backup.arrival`          tickets: who takes part in a global step
:mod:`~commrt.sync.backup.recovery`         the participants' all-reduce: commit or redo
:mod:`~commrt.sync.backup.catchup`          snapshot requests and receiving them
:mod:`~commrt.sync.backup.serving`          serving the others' requests
:mod:`~commrt.sync.backup.rejoin`           a replacement of a dead rank comes back
:mod:`~commrt.sync.backup.liveness`         heartbeats, recorded deaths, the end handshake
:mod:`~commrt.sync.snapshot`                parameters + optimizer state (shared)
:mod:`~commrt.sync.backup.wire`             the gloo groups reductions run on
:mod:`~commrt.sync.backup.waiter`           gloo waits given up once a member is recorded dead
:mod:`~commrt.sync.backup.keys`             every control-store key, in one place
==========================================  ==========================================
"""

from __future__ import annotations

from commrt.sync.backup.arrival import Arrival, Role
from commrt.sync.backup.catchup import CatchUp
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.liveness import HEARTBEAT_S, Liveness, RankDeclaredDeadError
from commrt.sync.backup.policy import BackupPolicy, BackupReport
from commrt.sync.backup.rejoin import RejoinedTooLate
from commrt.sync.snapshot import PIECE_BYTES, load_snapshot, pack_snapshot, snapshot_layout

__all__ = [
    "Arrival",
    "BackupPolicy",
    "BackupReport",
    "CatchUp",
    "HEARTBEAT_S",
    "Keys",
    "Liveness",
    "PIECE_BYTES",
    "RankDeclaredDeadError",
    "RejoinedTooLate",
    "Role",
    "load_snapshot",
    "pack_snapshot",
    "snapshot_layout",
]
