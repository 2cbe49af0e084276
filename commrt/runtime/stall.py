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
timeout may close the connection this rank waits on), so that a program which catches the error and exits still
has it. On a stall, and when a rank dies of an uncaught commrt error (the
abort-on-error hook, :mod:`commrt.runtime.abort`), :meth:`StallWatch.diagnose`
runs once per process. Either way the verdict is formed once per process
(:meth:`StallWatch.form`): the rank publishes its *view* (position and its
main thread's stack, as JSON: nothing received is ever executed or
unpickled), the first rank to ask becomes the judge, waits up to
:data:`GATHER_S` for every view, judges the ranks that did not answer from
their heartbeats and, on its own host, their process state
(``/proc/<pid>/stat``: ``T`` stopped, gone or ``Z`` dead), and publishes the
verdict (:mod:`commrt.runtime.verdict`). Every rank prints that verdict (in
full the lowest rank of each host that answered, the others one line that
points to it, as does a rank whose error's message carries it), writes
``COMMRT_DUMP``'s files if asked, and waits (at most :data:`PRINTED_S`) until
every rank that answered has printed: the store's host (rank 0 where no
launcher hosts it) and ``mpiexec``, which ends the job when one rank exits,
cannot take the verdict from a rank that has not printed it yet. Then the
job ends (unless the abort-on-error hook is off: then waits go on to their
timeout). A rank that ended after its own call failed (a peer's connection
closed under it) left a farewell that says so, and is never the root cause.

The store: the gloo rendezvous store (a fresh connection to it), or under
MPI a TCPStore that rank 0 hosts, its port sent over MPI at ``init``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque

from commrt import settings
from commrt.runtime.abort import end_job, say
from commrt.runtime.departures import FAILED
from commrt.runtime.elastic import guard_sigterm, write_error_file
from commrt.runtime.frames import is_user, short
from commrt.runtime.polling import poll
from commrt.runtime.threads import background_thread, program_ending
from commrt.runtime.verdict import judge, pointer, printer, render
from commrt.transports import processes

_APPLIES = "the stall watch"
DEFAULT_STALL_S = settings.Seconds(
    60.0, "the least default stall period", _APPLIES, settings.STALLS
)
MAX_DEFAULT_STALL_S = settings.Seconds(
    300.0, "the most default stall period", _APPLIES, settings.STALLS
)
GATHER_S = settings.Seconds(
    3.0, "how long the judge waits for every rank's view of a stall", _APPLIES, settings.STALLS
)
PRINTED_S = settings.Seconds(
    3.0, "how long a rank waits for the others to print the verdict", _APPLIES, settings.STALLS
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
    """The watch thread of one communicator (module docs). ``client()`` opens a new
    connection to the job's store, its keys under this communicator's prefix."""

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
        self.main = threading.main_thread().ident
        self._since, self._mark = time.monotonic(), None
        self._stop, self._once = threading.Event(), threading.Lock()
        #: the verdict, once formed (:meth:`form`), and whether an error's message carries it
        self.verdict: dict | None = None
        self.told = False
        self._printed = False  # whether this process printed its verdict (:meth:`_tell`)
        self.said = threading.Event()  # set once its line is out
        self._forming = threading.Lock()
        self._board = None  # the store connection the verdict was formed through
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
        (:attr:`hosting`) first waits (at most two ticks) until every other rank has closed or stopped
        beating: a heartbeat to a store that is gone makes torch print a C++ trace."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            store = self._store  # no new connection: the store may be gone
            store.add("closed", 1)
            if self.hosting:
                store.set("host_leaving", "1")
                done = lambda: int(store.add("closed", 0)) + int(store.add("acked", 0))  # noqa: E731
                _poll(lambda: done() >= self.world_size, 2 * self.tick)
        except Exception:  # the store is gone already: nobody left to tell
            pass

    def drops(self, source) -> None:
        """Register ``source()``: the ranks a protocol dropped (backup workers' dead)."""
        self._drops.append(source)

    @property
    def judging(self) -> bool:
        """Whether this process is giving its stall verdict (which ends the job)."""
        return self._once.locked()

    def dropped(self) -> set[int]:
        return {r for source in self._drops for r in source()}

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

    # -- the verdict
    def form(self, reason: str, failed: bool = False, told: bool = False) -> dict | None:
        """The verdict: publish this rank's view, then judge (the first rank to ask) or wait
        for the judge's. Once per process: a second caller waits for the first and gets
        the same verdict. None where the store failed (said on stderr). ``failed``: for an
        error this rank dies of (its position is where its last collective raised);
        ``told``: an error's message will carry the verdict (:meth:`at_error`)."""
        with self._forming:
            self.told = self.told or told
            if self.verdict is None:
                self._stop.set()
                try:
                    store = self.client()
                    store.add("declared", 1)
                    store.set(f"view/{self.rank}", json.dumps(self.view(reason, failed)))
                    if store.add("judge", 1) == 1:
                        verdict = self.judge_views(store)
                        store.set("verdict", json.dumps(verdict))
                    else:
                        verdict = self._wait_verdict(store)
                    self.verdict, self._board = verdict, store
                except Exception as e:  # the store died under us: say so
                    say(f"commrt: rank {self.rank}: no stall verdict ({e})")
                    return None
            return self.verdict

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
            if not _poll(lambda: store.check(["declared"]), GATHER_S):
                return
        except Exception:  # the store is gone (the job is ending): no verdict to join
            return
        self.at_error(error)

    def peer_gone(self, store, rank: int) -> bool:
        """Whether ``rank``'s process, on this host by its last heartbeat, is gone."""
        beat = _read(store, f"beat/{rank}") or {}
        if beat.get("host") != self.host or not beat.get("pid"):
            return False  # another host's, or never beat: unknown
        return processes.gone(beat["pid"])

    def diagnose(self, reason: str, failed: bool = False, then=None) -> None:
        """Form the verdict (:meth:`form`), print it (unless an error's message carried it),
        dump it, call ``then()`` (the abort hook's traceback: the verdict comes first), end
        the job. Once per process; a second caller waits for the first (which ends it)."""
        if not self._once.acquire(blocking=False):
            time.sleep(GATHER_S + 2 * PRINTED_S + 5)
            return
        verdict = self.form(reason, failed)
        if self.told and not failed:  # an error carries the verdict: whoever raised it ends
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
        """Print the verdict (in full on the lowest rank of the host that answered; else,
        or where the error this rank raises carries it, one line that points to it), dump
        it, and wait (at most :data:`PRINTED_S`) until every rank that answered has printed
        its own: no rank leaves first, so neither the store's host (rank 0, where no
        launcher hosts it) nor ``mpiexec`` ending the job can take a rank's verdict away
        before it is out. Once per process."""
        if self._printed:
            return
        self._printed, store = True, self._board
        try:
            first = printer(verdict, self.host)
            if self.told:
                said = pointer(verdict, self.rank, "in full in the error raised here")
            elif first is None or first == self.rank:
                said = render(verdict)
            else:
                said = pointer(verdict, self.rank, f"rank {first} prints it in full")
            say(said)
            self.said.set()
            self._dump(verdict)
            write_error_file(verdict, render(verdict))
            store.add("printed", 1)
            answered = sum(v["state"] == "published" for v in verdict.get("views", []))
            _poll(lambda: int(store.add("printed", 0)) >= answered, PRINTED_S)
        except Exception:  # the store is gone: the others have ended already
            pass

    def view(self, reason: str, failed: bool = False) -> dict:
        """What this rank says of itself (:mod:`commrt.runtime.verdict`'s view)."""
        frame = sys._current_frames().get(self.main)
        stack = traceback.extract_stack(frame) if frame is not None else []
        return {
            "rank": self.rank, "host": self.host, "pid": self.pid, "state": "published",
            "position": self.where(failed), "idle_s": round(self.idle_s(), 1), "reason": reason,
            "stack": [[short(f.filename), f.lineno, f.name, is_user(f.filename)] for f in stack],
        }  # fmt: skip

    def judge_views(self, store) -> dict:
        """As the judge: wait for every rank's view (at most :data:`GATHER_S`; as long
        again for a rank that beat meanwhile), make up the missing ones (:meth:`_absent`),
        and return the verdict with the views."""
        ranks = range(self.world_size)
        before = {r: _read(store, f"beat/{r}") for r in ranks}
        # a rank whose process is gone never answers: nobody waits for it. One that beat
        # since the stall was declared has seen it (a watch beats, then looks): its view is
        # on its way, however slow the machine (without it: NOT ANSWERING, on every rank)
        if not _poll(lambda: all(self._answered(store, r) for r in ranks), GATHER_S):
            late = [r for r in ranks if _beat_of(before[r]) != _beat_of(_read(store, f"beat/{r}"))]
            _poll(lambda: all(self._answered(store, r) for r in late), GATHER_S)
        views, dropped = [], self.dropped()
        for r in ranks:
            view = _read(store, f"view/{r}")
            if view is None:
                view = self._absent(r, before[r], _read(store, f"beat/{r}"))
            views.append(view | ({"state": "dropped"} if r in dropped else {}))
        verdict = judge(views, self.stall_s)
        return verdict | {"views": views}

    def _answered(self, store, rank: int) -> bool:
        return store.check([f"view/{rank}"]) or self.peer_gone(store, rank)

    def _absent(self, rank: int, before: dict | None, after: dict | None) -> dict:
        """The view of a rank that did not answer, from its heartbeats and process state,
        or its farewell: a rank that failed (its call broke when a peer left, say) and
        then ended is ``left``, never a root cause."""
        beat = after or before or {}
        view = {"rank": rank, "host": beat.get("host"), "pid": beat.get("pid"), "stack": []}
        view["position"] = beat.get("position", {})
        view["idle_s"] = round(time.time() - beat["time"], 1) if "time" in beat else None
        farewell = self.departures.farewell_of(rank)
        if farewell is not None and farewell.how == FAILED:
            return view | {"state": "left", "cause": None if farewell.cause < 0 else farewell.cause}
        alive = before is not None and after is not None and after["beat"] != before["beat"]
        if beat.get("host") == self.host and beat.get("pid"):
            letter = processes.state(beat["pid"])
            stopped = "stopped" if letter in processes.STOPPED else "silent"
            state = "dead" if processes.ended(letter) else stopped
        else:
            state = "silent" if alive else "lost"  # another host: dead or stopped, unknown
        return view | {"state": state}

    def _wait_verdict(self, store) -> dict:
        if _poll(lambda: store.check(["verdict"]), GATHER_S + 2 * PRINTED_S):
            return _read(store, "verdict")
        return self.judge_views(store)  # the judge died on the way: judge here

    def _dump(self, verdict: dict) -> None:
        if not (folder := settings.DUMP.text()):
            return
        os.makedirs(folder, exist_ok=True)
        kept = list(self.history)  # sampled at beats: the position now ends it, as judged
        kept += [p for p in [self.where()] if p not in kept[-1:]]
        path = os.path.join(folder, f"rank{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": self.rank, "positions": kept, "verdict": verdict}, f, indent=1)
        os.replace(path + ".tmp", path)


def _read(store, key: str):
    try:
        return json.loads(bytes(store.get(key)).decode()) if store.check([key]) else None
    except (RuntimeError, ValueError):
        return None


def _beat_of(beat: dict | None):
    return None if beat is None else beat.get("beat")


def _poll(done, timeout: float) -> bool:
    # a verdict's waits ask the store at most every 50 ms: every rank asks at once
    return poll(done, timeout, most_pause_s=0.05)


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
        client, comm.rank, comm.world_size, comm.executor.position, comm.departures,
        declares(stall_s, comm.timeout),
    )  # fmt: skip
    watch.server, watch.ends_job = server, ends_job  # rank 0's server lives as long as it
    mpi = comm.transport.traits.meets_through_mpi
    watch.hosting = server is not None if mpi else comm.rank == 0
    if ends_job:
        guard_sigterm(watch)
    return watch.start()


def _store_address(comm):
    """(host, port, server) of the store the watch meets in: the gloo rendezvous store's,
    or one rank 0 hosts under MPI (the server on rank 0, else None)."""
    from commrt.runtime.rendezvous import bcast_text, mpi_world, reachable_by_all, serve

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
        host, port, is_master=False, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=min(timeout, STORE_CONNECT_S)),
    )  # fmt: skip
