"""Who is still there: heartbeats, deaths recorded in the store, and the end handshake.

Each rank's background thread does three store operations per period
(:func:`beat_period`: :data:`HEARTBEAT_S`, or less for a small
``dead_after_s``), so the store sees O(p) operations per period for the
whole job, not the O(p²) of every rank reading every counter:

1. **beat**: ``add`` 1 to its own counter ``hb/{rank}``;
2. **check one neighbour**: read the counter of the next rank in ring
   order (rank+1, rank+2, … mod p) that is neither dead nor gone. A
   counter that has not moved for ``dead_after_s`` *and* over at least
   :func:`quiet_reads_needed` of this thread's own reads is a death: the
   checker records it (``dead/{rank}``, then an entry ``died/{i}`` under
   the next number of the ``ndead`` counter). Needing several reads of
   its own keeps a checker that was itself stalled (a loaded machine, a
   paused process) from blaming its neighbour for its own silence. When
   the checked rank dies, its checker moves on to the next live rank, so
   the dead rank's own neighbour is checked again, by a new checker that
   gives it a full ``dead_after_s``: two adjacent ranks dying together
   are both found, the second after about twice ``dead_after_s``. A rank
   that said ``bye`` (closed) is *gone*, not dead: its checker moves on.
3. **read the death counter** ``ndead``: only when it moved does the
   thread read the new ``died/{i}`` entries and update :attr:`Liveness.missing`.

**False suspicion.** A rank that was only slow (stopped for longer than
``dead_after_s``, e.g. SIGSTOP or swapping) and comes back finds itself
declared dead: the others have stopped waiting for it at the end. It
does not re-announce itself; it raises :class:`RankDeclaredDeadError`
at its next step (before taking a ticket, so no step waits on it) and
at ``close()`` (without draining), via :meth:`Liveness.check_alive`.
One store read per step (``dead/{rank}``) makes that check exact even
when this rank's own thread has not run yet.

A rank beats once as it starts (at the end of its setup); a counter that
never moved from 0 belongs to a rank still setting up, and is called dead
only after the communicator's timeout, not ``dead_after_s``.

**Incarnations.** A replacement of a dead rank (:mod:`commrt.sync.backup.rejoin`)
is that rank's incarnation j >= 1: it beats on its own counter and is
declared dead under its own key (:class:`~commrt.sync.backup.keys.Keys`), so
neither the old incarnation's stale record stops it nor can a woken old
incarnation pass for it. Its return is an entry of the same log as the
deaths (``"{rank} back {j}"``): every rank learns it with the death
counter it already reads each beat, takes the rank out of
:attr:`Liveness.missing` and checks the new counter.

At the end, a rank that holds the final state says so under its ``fin``
key, and one that is done with the store under its ``bye`` key.
"""

from __future__ import annotations

import json
import threading
import time

from commrt import settings
from commrt.errors import CommError
from commrt.process.threads import background_thread, program_ending
from commrt.runtime.store import ControlStore
from commrt.sync.backup.keys import Keys, incarnation_of, rank_of

HEARTBEAT_S = settings.Seconds(
    0.25,
    "the longest time between two heartbeats of a backup worker",
    "backup workers' liveness",
    settings.POLLING,
)


def beat_period(dead_after_s: float) -> float:
    """Seconds between two beats: :data:`HEARTBEAT_S`, or ``dead_after_s / 8`` when smaller,
    so that a rank is never called dead after fewer than 8 missed beats."""
    return min(HEARTBEAT_S, dead_after_s / 8)


def quiet_reads_needed(dead_after_s: float) -> int:
    """How many of the checker's own reads must find the counter unmoved before it calls the
    neighbour dead (half the reads ``dead_after_s`` spans, at least 3)."""
    return max(3, int(0.5 * dead_after_s / beat_period(dead_after_s)))


#: the second word of a log entry that says a rank is back (the others: its checker's rank)
BACK = "back"


def log(store, entry: str) -> None:
    """Append ``entry`` to the membership log (a death, or a replacement back)."""
    i = int(store.add(Keys.DEATHS, 1)) - 1
    store.set(Keys.death(i), entry)


class RankDeclaredDeadError(CommError):
    """This rank was silent for ``dead_after_s`` and the others recorded it as dead."""

    def __init__(self, rank: int, declared_by: int, dead_after_s: float):
        #: this rank, and the rank that found it silent and recorded it dead
        self.rank, self.declared_by = rank, declared_by
        super().__init__(
            f"commrt: rank {rank} was declared dead by rank {declared_by} (no heartbeat for "
            f"{dead_after_s:g} s, backup workers): the other ranks no longer wait for it, "
            f"so it stops here. A rank this slow needs a larger dead_after_s "
            f"(BackupWorkers(dead_after_s=...), or commrt train --dead-after)."
        )

    @property
    def watcher(self) -> int:
        """The former name of :attr:`declared_by`, kept for code that reads it."""
        return self.declared_by


class NeighbourBeats:
    """The heartbeat counter of the neighbour this rank checks, as its thread sees it (pure
    bookkeeping, no store)."""

    def __init__(self, target: int, now: float, incarnation: int = 0):
        self.target, self.value, self.changed_at, self.quiet = target, None, now, 0
        self.incarnation = incarnation

    def saw(self, value: int, now: float) -> None:
        if value != self.value:
            self.value, self.changed_at, self.quiet = value, now, 0
        else:
            self.quiet += 1

    def silent(self, now: float, dead_after_s: float, reads: int) -> bool:
        return now - self.changed_at > dead_after_s and self.quiet >= reads


def next_checked(rank: int, world_size: int, skip) -> int | None:
    """The next rank after ``rank`` in ring order that is not in ``skip`` (None: none left)."""
    for k in range(1, world_size):
        r = (rank + k) % world_size
        if r not in skip:
            return r
    return None


class Liveness:
    """This rank's heartbeat, its check of one neighbour, the recorded deaths, and the end."""

    def __init__(
        self,
        cs: ControlStore,
        space: str,
        store,
        rank: int,
        world_size: int,
        dead_after_s: float,
        timeout: float,
        incarnation: int = 0,
    ):
        self.rank, self.p = rank, world_size
        #: this process's incarnation of its rank (0: started with the job)
        self.incarnation = incarnation
        #: rank -> its current incarnation, where not 0 (set by the thread, from the log)
        self.incarnations: dict[int, int] = {}
        #: other ranks recorded dead in the store (set by the thread)
        self.missing: frozenset[int] = frozenset()
        #: ranks that said bye (closed cleanly) found by this rank's check
        self.gone: set[int] = set()
        #: the rank that declared this one dead, once seen (set by the thread)
        self.declared_by: int | None = None
        self.dead_after_s, self.timeout = dead_after_s, timeout
        self.period = beat_period(dead_after_s)
        self.store = store  # the policy's connection (the end handshake)
        self._cs, self._space = cs, space  # the thread opens its own connection
        self._read_upto = 0  # died/{i} entries read so far
        self._stop = threading.Event()
        self._thread = background_thread(self._run, f"commrt-backup-hb-r{rank}")  # store calls

    def start(self, stall=None) -> None:
        """Beat once now (a rank that finished setting up has beaten), then in the thread.
        ``stall``: the communicator's stall watch (commrt.diagnosis.stall), told which ranks
        are dropped, so that a stall verdict reports them as dropped, never as hung."""
        self.store.add(Keys.heartbeat(self.rank, self.incarnation), 1)
        if stall is not None:
            stall.drops(lambda: self.missing)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout)

    def _run(self) -> None:
        try:
            store = self._cs.client(self._space)
        except RuntimeError:
            return
        neighbour: NeighbourBeats | None = None
        beat = Keys.heartbeat(self.rank, self.incarnation)
        reads = quiet_reads_needed(self.dead_after_s)
        while not self._stop.wait(self.period):
            if program_ending():  # never stopped (no close()): do not hold the exit
                return
            try:
                store.add(beat, 1)
                self.refresh(store)
                neighbour = self._check_neighbour(store, neighbour, reads)
            except RuntimeError:  # the store went away (its host ended): nothing more to check
                return

    def _check_neighbour(
        self, store, neighbour: NeighbourBeats | None, reads: int
    ) -> NeighbourBeats | None:
        now = time.monotonic()
        target = next_checked(self.rank, self.p, self.missing | self.gone)
        if target is None:
            return None
        inc = self.incarnations.get(target, 0)
        if neighbour is None or (neighbour.target, neighbour.incarnation) != (target, inc):
            neighbour = NeighbourBeats(target, now, inc)  # a new neighbour gets a full dead_after_s
        neighbour.saw(int(store.add(Keys.heartbeat(target, inc), 0)), now)
        # a rank that never beat has not finished its setup yet: the timeout, not
        # dead_after_s, decides that it is not coming
        limit = self.dead_after_s if neighbour.value else max(self.dead_after_s, self.timeout)
        if neighbour.silent(now, limit, reads):
            if store.check([Keys.bye(target)]):
                self.gone.add(target)
            else:
                self.declare_dead(store, target)
                self.refresh(store)
        return neighbour

    def declare_dead(self, store, rank: int) -> None:
        """Record in the store that ``rank`` (its current incarnation) is dead (this rank
        found it silent)."""
        inc = self.incarnations.get(rank, 0)
        # the log entry first: a replacement waits for the key, and its return must come
        # after this death in the log
        log(store, f"{rank} {self.rank} {inc}")
        store.set(Keys.dead(rank, inc), str(self.rank))

    def refresh(self, store) -> None:
        """Read the log's counter; read the new entries only when it moved."""
        count = int(store.add(Keys.DEATHS, 0))
        found, incarnations = set(self.missing), dict(self.incarnations)
        while self._read_upto < count:
            key = Keys.death(self._read_upto)
            if not store.check([key]):  # counted, entry not written yet: read it next period
                break
            rank, what, inc = store.get(key).decode().split()
            self._read_upto += 1
            rank, inc = int(rank), int(inc)
            if what == BACK:  # a replacement rejoined: checked again, under its incarnation
                incarnations[rank] = inc
                found.discard(rank)
            elif rank != self.rank and inc >= incarnations.get(rank, 0):
                found.add(rank)
            elif inc == self.incarnation:  # not an earlier incarnation of this rank
                self.declared_by = int(what)
        # other threads read both (recorded_dead): missing first, so that in between a
        # replacement's return reads as "not dead yet", never its new incarnation as dead
        if found != self.missing:
            self.missing = frozenset(found)
        self.incarnations = incarnations

    def recorded_dead(self, name: str) -> bool:
        """Whether the incarnation that wrote the ticket name ``name`` is recorded dead, as far
        as this rank's thread has read the log: its rank is :attr:`missing` under that
        incarnation or a later one, or a later incarnation came back (a replacement comes
        back only once the one before it is recorded dead: :mod:`.rejoin`). The second case
        is a death and its replacement's return read in one beat: the rank never shows in
        :attr:`missing`, yet a round that waits on the old incarnation waits in vain."""
        rank, inc = rank_of(name), incarnation_of(name)
        known = self.incarnations.get(rank, 0)
        return known > inc or (rank in self.missing and known >= inc)

    def check_alive(self) -> None:
        """Raise :class:`RankDeclaredDeadError` if the others recorded this rank as dead
        (one store read, on the policy's connection)."""
        mine = Keys.dead(self.rank, self.incarnation)
        if self.declared_by is None and self.store.check([mine]):
            self.declared_by = int(self.store.get(mine))
        if self.declared_by is not None:
            raise RankDeclaredDeadError(self.rank, self.declared_by, self.dead_after_s)

    # ------------------------------------------------------------ the end
    def hold_final(self, record: dict) -> None:
        """Say that this rank holds the final state (``record``: its step and counts)."""
        self.store.set(Keys.final(self.rank), json.dumps(record))

    def read_finals(self, ranks, into: dict[int, dict]) -> None:
        """Add to ``into`` the records of the ``ranks`` that now hold the final state."""
        for r in ranks:
            if r not in into and self.store.check([Keys.final(r)]):
                into[r] = json.loads(self.store.get(Keys.final(r)))

    def say_bye(self) -> None:
        self.store.set(Keys.bye(self.rank), "1")

    def wait_for_byes(self, ranks, deadline: float) -> None:
        """Until ``deadline`` at most, wait until every rank of ``ranks`` is done with the store."""
        keys = [Keys.bye(r) for r in ranks]
        while time.monotonic() < deadline and not self.store.check(keys):
            time.sleep(0.01)
