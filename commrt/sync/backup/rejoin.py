"""A replacement process rejoins a running backup-workers job under a dead rank's number.

Started with the dead rank's ``RANK`` (and the job's ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` or ``COMMRT_STORE``) and ``COMMRT_REJOIN=1``,
a process runs the same training script; nobody else restarts:

1. **Its communicator** (``commrt.init("gloo")``) has no connection on the
   job's gloo group: gloo cannot add a member to a group that already met
   (:class:`~commrt.transports.gloo.GlooRejoined`). It needs the control
   store hosted outside the ranks (the launcher's, or torchrun's agent
   store): that is where it finds everything else.
2. **Its GradientSync** skips the construction's collectives (the layout
   check and rank 0's weights; the others are long past them). Its policy
   finds the same key space (the same script makes the same policies in
   the same order) and, in :func:`enter`, takes the next *incarnation* j of
   its rank from the store's ``inc/{rank}`` counter; it then waits (bounded
   by the timeout) until incarnation j - 1 is recorded dead, so that the
   death is noticed, and any step that waits on it redone, before anyone
   sees the rank alive again.
3. **It comes back** (:func:`announce`): it beats on its own counter
   ``hb/{rank}/{j}`` (declared dead, if ever, under ``dead/{rank}/{j}``: a
   stale record of the old incarnation cannot stop it, and a woken old
   incarnation still finds itself dead), sets the store's ``broken`` flag
   (no step runs on the group made at setup any more: every step's
   participants make or reuse a group of their own, as after a redo,
   :mod:`commrt.sync.backup.recovery`), and appends ``"{rank} back {j}"`` to
   the membership log. Every live rank's heartbeat thread reads that log's
   counter once per beat already (:mod:`commrt.sync.backup.liveness`), so
   it learns of the return within a beat, with no extra store operation
   per step: the rank leaves ``missing`` and is checked again, under its
   new counter.
4. **It catches up.** Its first step takes no ticket (its gradient, computed
   on weights it never had, is dropped): it asks for a snapshot of any
   global step (:mod:`commrt.sync.backup.catchup`), loads the parameters
   and optimizer state bit for bit in ``sync.step``, and so learns the
   global step too. The transfer runs on a two-rank group made for it: the
   job's group does not reach a replacement. From its second step on it
   takes tickets like any rank; on time, its gradient counts, and the
   participants' group is made for them (the ticket name ``"{rank}.{j}"``
   tells a replacement from the rank it replaced, so nobody reuses a group
   the replacement never joined).

**Too late.** A replacement that comes back once every other rank is done
(said ``bye`` after ``close()``, or is recorded dead) has nobody to catch up
from: it raises :class:`RejoinedTooLate` at once instead of waiting out
the timeout. One that comes back while the others drain in ``close()`` is
waited for and served like any rank that is behind.

**A replacement that dies** is a death like any other: its counter stops,
its checker records incarnation j dead, a snapshot on its way to it is
given up, and a group being made with it (a round's, or a catch-up pair's)
stops waiting for it then (:class:`~commrt.sync.backup.wire.PollingStore`).
Another replacement (j + 1) may follow.

**Not covered.** A store hosted by rank 0 (plain ``mpiexec``, or
``commrt.init`` with no launcher) cannot be found by a new process: rejoin
needs the launcher's or torchrun's agent store. MPI and NCCL cannot add a
process either. ``inner="auto"`` is refused (its choice is a collective
probe the replacement cannot join).

**Who is dead in a round.** A round's group and its outcome give up waiting
only when the incarnation that took a ticket is recorded dead: not when a
rank has not yet read a replacement's return (under heavy load it would
give up a group the others still make, and every rank would time out),
but also when a rank read the death and the return in one beat, so that
the rank never shows as missing (a rank that kept waiting would sit out the
timeout while the others redo the step, and their redo would time out
without it).
"""

from __future__ import annotations

from commrt import settings
from commrt.algorithms.auto import Auto
from commrt.errors import CommError, CommTimeoutError
from commrt.process.polling import poll
from commrt.runtime.store import launcher_store
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.liveness import BACK, log


def check_rejoin(inner) -> None:
    """A ValueError unless a replacement can join: the job's store is hosted outside the
    ranks, and ``inner`` is not ``auto`` (whose probe it cannot join)."""
    if launcher_store() is None:
        raise ValueError(
            f"commrt: COMMRT_REJOIN=1 needs the job's control store hosted outside the "
            f"ranks ({settings.STORE.name}=host:port, as `commrt train` sets, or torchrun's agent "
            "store: TORCHELASTIC_USE_AGENT_STORE=true with MASTER_ADDR/MASTER_PORT); a "
            "store hosted by rank 0 cannot be found again by a new process"
        )
    if isinstance(inner, Auto):
        raise ValueError(
            "commrt: a replacement cannot rejoin backup workers with inner='auto' (its "
            "choice is made by a probe every rank runs together at the start); pass the "
            "inner all-reduce by name (ring, halving_doubling, torus2d) in every rank"
        )


def enter(store, rank: int, algorithm, timeout: float) -> int:
    """This process's incarnation of ``rank`` (1 for the first replacement), once the
    incarnation it replaces is recorded dead (waits up to ``timeout``)."""
    inc = int(store.add(Keys.incarnation(rank), 1))
    before = Keys.dead(rank, inc - 1)
    if not poll(lambda: store.check([before]), timeout):
        raise CommTimeoutError(
            rank=rank,
            peer=rank,
            timeout_s=timeout,
            algorithm=str(algorithm),
            step=None,
            what=(
                f"the process it replaces (rank {rank}, incarnation {inc - 1}) to be recorded "
                "dead; is it still running? A replacement may join only once its rank died"
            ),
        )
    return inc


def _done(store, rank: int) -> bool:
    """``rank`` closed (said bye), or its current incarnation is recorded dead."""
    inc = int(store.add(Keys.incarnation(rank), 0))
    return store.check([Keys.bye(rank)]) or store.check([Keys.dead(rank, inc)])


class RejoinedTooLate(CommError):
    """A replacement came back after every other rank was done: nobody can serve it."""


def announce(store, rank: int, incarnation: int, world_size: int) -> None:
    """Tell the job that ``rank`` is back as ``incarnation`` (after its first beat); raise
    :class:`RejoinedTooLate` if every other rank is done already."""
    store.set(Keys.BROKEN, "1")  # before any ticket of this rank: module docs, step 3
    log(store, f"{rank} {BACK} {incarnation}")
    if all(_done(store, r) for r in range(world_size) if r != rank):
        raise RejoinedTooLate(
            f"commrt: rank {rank} came back (incarnation {incarnation}) after every other "
            "rank had finished training and closed: there is nothing left to join"
        )
