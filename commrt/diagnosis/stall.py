"""The stall watch: one verdict on every rank, when a job stalls, of who is stuck and where.

Each multi-rank communicator runs a :class:`StallWatch`, a thread that
every :data:`tick <StallWatch.tick>` seconds

* samples the rank's :class:`~commrt.schedule.position.Position` (what the
  executor wrote: no cost on the collective's path) and notes when it last
  changed: the time of the last progress;
* writes a heartbeat to the job's store, ``beat/<rank>``: a counter, the
  host, the pid and the last position, as JSON;
* looks for a stall declared by any rank (``declared``), and declares one
  itself when this rank has been inside one schedule step for
  ``stall_s`` seconds (``COMMRT_STALL_S``, default :func:`default_stall_s`:
  half the timeout, between 60 s and 5 minutes; ``0`` turns the watch off).
  Where that is not shorter than the timeout, the watch still beats and
  answers, but declares nothing itself: the timeout declares the stall.

When a wait of the communicator times out, :meth:`StallWatch.at_error`
forms the verdict *before* the error is raised and appends its text to the
error's message (as :meth:`StallWatch.after_broken_call` does where a call
broke under the rank or a peer failed while a stall was declared: a peer's
timeout may close the connection this rank waits on), so that a program which
catches the error and exits still has it. On a stall, and when a rank dies of
an uncaught commrt error (the abort-on-error hook,
:mod:`commrt.diagnosis.abort`), :meth:`StallWatch.diagnose` runs once per
process. Either way the verdict is formed once per process, by a hearing
(:mod:`commrt.diagnosis.hearing`: every rank's view, one judge), and told on
every rank (:mod:`commrt.diagnosis.telling`: printed, dumped, written where
torchrun reads it). Then the job ends (unless the abort-on-error hook is off:
then waits go on to their timeout).

The store: the gloo rendezvous store (a fresh connection to it), or under
MPI a TCPStore that rank 0 hosts, its port sent over MPI at ``init``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque

from commrt import settings
from commrt.diagnosis.abort import end_job
from commrt.diagnosis.departures import FAILED
from commrt.diagnosis.hearing import GATHER_S, PRINTED_S, Hearing, poll_store
from commrt.diagnosis.telling import Telling
from commrt.diagnosis.verdict import render
from commrt.process.elastic import guard_sigterm
from commrt.process.threads import background_thread, program_ending

_APPLIES = "the stall watch"
DEFAULT_STALL_S = settings.Seconds(
    60.0, "the least default stall period", _APPLIES, settings.STALLS
)
MAX_DEFAULT_STALL_S = settings.Seconds(
    300.0, "the most default stall period", _APPLIES, settings.STALLS
)
STORE_CONNECT_S = settings.Seconds(
    30.0,
    "the longest the stall watch waits to reach the job's store (less where the timeout is)",
    _APPLIES,
    settings.STALLS,
)
KEEP = 16  # positions kept for the post-mortem file


def default_stall_s(timeout: float | None) -> float:
    """Half the timeout, at least :data:`DEFAULT_STALL_S` and at most
    :data:`MAX_DEFAULT_STALL_S`: the verdict comes well before the timeout, and a rank
    that pauses a minute or two on purpose (a checkpoint, an evaluation) while the others
    wait in a collective is not taken for a stall (the verdict ends the job)."""
    if timeout is None:
        return DEFAULT_STALL_S
    return max(DEFAULT_STALL_S, min(MAX_DEFAULT_STALL_S, timeout / 2))


def stall_seconds(value=None, timeout: float | None = None) -> float | None:
    """The stall watch's period from ``value`` or ``COMMRT_STALL_S``; None when off (0 or
    off). A period not shorter than ``timeout`` still runs the watch (:func:`declares`)."""
    s = settings.STALL.get() if value is None else settings.STALL.read(value)
    if s is None:
        return default_stall_s(timeout)
    return s or None  # 0.0: off


def declares(stall_s: float, timeout: float | None) -> float | None:
    """The seconds without progress after which the watch declares a stall itself: ``stall_s``
    where it is shorter than ``timeout``; else None, and the timeout declares it
    (:meth:`StallWatch.at_error`): a rank that pauses on purpose for less than the
    timeout is never ended by a watch the user did not ask to be shorter."""
    return stall_s if timeout is None or stall_s < timeout else None


class StallWatch:
    """The watch thread of one communicator (module docs), and the three ways a verdict
    is asked for: a stall (:meth:`diagnose`), a timeout (:meth:`at_error`) and a call
    broken while a stall is declared (:meth:`after_broken_call`). The verdict is formed
    by its :class:`~commrt.diagnosis.hearing.Hearing` and told by its
    :class:`~commrt.diagnosis.telling.Telling`. ``client()`` opens a new connection to
    the job's store, its keys under this communicator's prefix."""

    def __init__(self, client, rank: int, world_size: int, position, departures, stall_s):
        self.client, self.rank, self.world_size = client, rank, world_size
        self.position, self.departures = position, departures
        #: seconds in one step that declare a stall; None: only a timeout declares one
        self.stall_s = stall_s
        self.tick = min(1.0, stall_s / 4) if stall_s is not None else 1.0
        self.host, self.pid = socket.gethostname(), os.getpid()
        #: whether the verdict ends the job (the abort-on-error hook's setting)
        self.ends_job = True
        #: whether the store may live in this process (rank 0's rendezvous, MPI's rank 0's)
        self.hosting = rank == 0
        #: callables that name ranks backup workers dropped: reported so, never blamed
        self._drops: list = []
        self.history: deque = deque(maxlen=KEEP)
        self._since, self._mark = time.monotonic(), None
        self._stop, self._once = threading.Event(), threading.Lock()
        self.hearing = Hearing(client, rank, world_size, departures, stall_s, self)
        self.telling = Telling(rank, self.host)
        self._store = client()
        self.beats = 0
        # its beats are store calls, in C++ without the GIL
        self._thread = background_thread(self._run, "commrt-stall-watch")

    def start(self) -> "StallWatch":
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the communicator closes). The rank that may host the store
        (:attr:`hosting`) first waits (at most two ticks) until every other rank has
        closed or stopped beating: a heartbeat to a store that is gone makes torch print
        a C++ trace."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            store = self._store  # no new connection: the store may be gone
            store.add("closed", 1)
            if self.hosting:
                store.set("host_leaving", "1")
                done = lambda: int(store.add("closed", 0)) + int(store.add("acked", 0))  # noqa: E731
                poll_store(lambda: done() >= self.world_size, 2 * self.tick)
        except Exception:  # the store is gone already: nobody left to tell
            pass

    def drops(self, source) -> None:
        """Register ``source()``: the ranks a protocol dropped (backup workers' dead)."""
        self._drops.append(source)

    def dropped(self) -> set[int]:
        return {r for source in self._drops for r in source()}

    @property
    def judging(self) -> bool:
        """Whether this process is giving its stall verdict (which ends the job)."""
        return self._once.locked()

    @property
    def verdict(self) -> dict | None:
        """The verdict, once formed in this process."""
        return self.hearing.verdict

    @property
    def said(self) -> threading.Event:
        """Set once this rank's line of the verdict is out."""
        return self.telling.said

    # -- the watch
    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            if program_ending():  # never stopped (no close()): do not hold the exit
                return
            try:
                if self._store.check(["host_leaving"]):  # rank 0 closes: stop beating first
                    self._stop.set()
                    self._store.add("acked", 1)
                    return
                if self.beat() and not self._stop.is_set():  # not this rank's own verdict
                    self.diagnose("another rank reported a stall")
                elif (
                    self.stall_s is not None
                    and self.position.step is not None
                    and self.idle_s() >= self.stall_s
                ):
                    self.diagnose(f"no progress inside a collective for {self.idle_s():.0f} s")
            except Exception:  # the store is gone (the job is ending): nothing to watch
                self._stop.set()
                return

    def idle_s(self) -> float:
        return time.monotonic() - self._since

    def beat(self) -> bool:
        """Sample the position, write the heartbeat; return whether a stall was declared."""
        pos = self.position
        mark = (pos.mark(), self.departures.calls, self.departures.sync_steps)
        if mark != self._mark:
            self._mark, self._since = mark, time.monotonic()
            self.history.append(self.where())
        self.beats += 1
        beat = {"beat": self.beats, "time": time.time(), "host": self.host, "pid": self.pid}
        self._store.set(f"beat/{self.rank}", json.dumps(beat | {"position": self.where()}))
        return self._store.check(["declared"])

    def where(self, failed: bool = False) -> dict:
        """This rank's position as plain data, with its call count and GradientSync step
        (``failed``: where the last collective raised, if it did)."""
        d = self.departures
        return self.position.describe(failed) | {
            "seq": d.calls,
            # counted from 0, as GradientSync's own steps (its stats, its trace) and a
            # loop over range() count them
            "sync_step": d.sync_steps if d.in_sync else None,
        }

    def positions(self) -> list[dict]:
        """The last positions, oldest first, as sampled at beats, ended by the position
        now (as judged): what the dump keeps."""
        kept = list(self.history)
        return kept + [p for p in [self.where()] if p not in kept[-1:]]

    def peer_gone(self, store, rank: int) -> bool:
        """Whether ``rank``'s process, on this host by its last heartbeat, is gone."""
        return self.hearing.peer_gone(store, rank)

    # -- the verdict asked for
    def form(self, reason: str, failed: bool = False, told: bool = False) -> dict | None:
        """The verdict (:meth:`commrt.diagnosis.hearing.Hearing.form`); the watch stops
        beating first."""
        self._stop.set()
        return self.hearing.form(reason, failed, told)

    def at_error(self, error) -> None:
        """Form the verdict before ``error`` is raised, and append its text to the error's
        message: whoever catches the error has it, even a program that then exits at once.
        ``error``: a :class:`~commrt.errors.CommTimeoutError` of this communicator's, or
        (:meth:`after_broken_call`) the failure of a call that broke under this rank
        while a stall was declared: such a rank's own timeout never comes."""
        verdict = self.form(str(error).splitlines()[0], failed=True, told=True)
        if verdict is not None:
            error.add_verdict(render(verdict))
            self._tell(verdict)

    def after_broken_call(self, error, peers) -> None:
        """Where a call broke under this rank (a peer's connection closed) or a peer
        failed (``peers``: the call's): join the stall verdict, if a stall was declared,
        as :meth:`at_error`. A peer that timed out closes the connection this rank waits
        on a moment before it declares, so while the peers live their declaration is
        awaited (at most :data:`GATHER_S`). A peer whose process is gone (on this host)
        died: no verdict is awaited and the error goes on at once (the launcher, or
        the abort-on-error hook's verdict, names the death)."""
        try:
            store = self.client()
            if any(self.peer_gone(store, p) for p in peers):
                return
            if not poll_store(lambda: store.check(["declared"]), GATHER_S):
                return
        except Exception:  # the store is gone (the job is ending): no verdict to join
            return
        self.at_error(error)

    def diagnose(self, reason: str, failed: bool = False, then=None) -> None:
        """Form the verdict (:meth:`form`), tell it (a pointer only, where an error's
        message carried it), call ``then()`` (the abort hook's traceback: the verdict
        comes first), end the job. Once per process; a second caller waits for the first
        (which ends it)."""
        if not self._once.acquire(blocking=False):
            time.sleep(GATHER_S + 2 * PRINTED_S + 5)
            return
        verdict = self.form(reason, failed)
        if self.hearing.told and not failed:  # an error carries the verdict: its raiser ends
            self._once.release()
            return
        if verdict is not None:
            self._tell(verdict)
        if then is not None:
            then()
        if self.ends_job:  # a farewell first: a peer that sees this rank go blames the root
            self.departures.announce(FAILED, (verdict or {}).get("root"))
            end_job(f"commrt: rank {self.rank}: ending the whole job after the stall verdict")

    def _tell(self, verdict: dict) -> None:
        self.telling.tell(verdict, self.hearing.board, self.hearing.told, self.positions())


def start_watch(comm, stall_s: float | None, ends_job: bool) -> StallWatch | None:
    """Start ``comm``'s stall watch (module docs), or None: one rank, the watch off, or no
    store to meet in (NCCL bootstrapped without one: its timeouts still name this rank).
    Collective under MPI (rank 0 hosts the store and sends its port to the others)."""
    if comm.world_size == 1 or stall_s is None:
        return None
    where = _store_address(comm)
    if where is None:
        return None
    host, port, server = where
    gen = _client(host, port, comm.timeout).add(f"stall_generation/{comm.rank}", 1)
    prefix = f"commrt/stall/{gen}/"

    def client():
        import torch.distributed as dist

        return dist.PrefixStore(prefix, _client(host, port, comm.timeout))

    watch = StallWatch(
        client,
        comm.rank,
        comm.world_size,
        comm.executor.position,
        comm.departures,
        declares(stall_s, comm.timeout),
    )
    watch.server, watch.ends_job = server, ends_job  # rank 0's server lives as long as it
    mpi = comm.transport.traits.meets_through_mpi
    watch.hosting = server is not None if mpi else comm.rank == 0
    if ends_job:
        guard_sigterm(watch)
    return watch.start()


def _store_address(comm):
    """(host, port, server) of the store the watch meets in: the gloo rendezvous store's,
    or one rank 0 hosts under MPI (the server on rank 0, else None)."""
    from commrt.process.rendezvous import bcast_text, mpi_world, reachable_by_all, serve

    tcp = tcp_under(comm.transport.store)
    if tcp is not None:
        return tcp.host, tcp.port, None
    if not comm.transport.traits.meets_through_mpi:
        return None
    world = mpi_world()
    host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if not reachable_by_all(world, bool(os.environ.get("MASTER_ADDR"))):
        return None
    # MPI's rank 0 hosts it (a torch.distributed group may number the ranks otherwise)
    server = serve(host, 0, comm.timeout) if world.Get_rank() == 0 else None
    port = int(bcast_text(world, str(server.port) if server is not None else ""))
    return bcast_text(world, host), port, server


def tcp_under(store):
    """The ``torch.distributed.TCPStore`` that ``store`` is, or that it wraps in
    PrefixStores (one in another, as torch.distributed's groups nest them); None for any
    other store (a HashStore, a FileStore) or none, which no other process can reach."""
    import torch.distributed as dist

    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store if isinstance(store, dist.TCPStore) else None


def _client(host: str, port: int, timeout: float):
    import datetime

    import torch.distributed as dist

    return dist.TCPStore(
        host,
        port,
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=min(timeout, STORE_CONNECT_S)),
    )
