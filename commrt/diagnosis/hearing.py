"""A stall's hearing: every rank's view gathered, the missing ones made up, one verdict.

Once a stall is declared (or a wait times out), each rank publishes its *view*
to the job's store: its position and its main thread's stack, as JSON (nothing
received is ever executed or unpickled). The first rank to ask becomes the
judge: it waits up to :data:`~commrt.diagnosis.stall.GATHER_S` for every view,
makes up the views of the ranks that did not answer from their heartbeats and,
on its own host, their process state (``/proc/<pid>/stat``: ``T`` stopped, gone
or ``Z`` dead), judges (:func:`commrt.diagnosis.verdict.judge`) and publishes
the verdict. Every other rank waits for it, and judges itself where the judge
died on the way. A rank that ended after its own call failed (a peer's
connection closed under it) left a farewell that says so, and is never the root
cause.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback

from commrt import settings
from commrt.diagnosis.abort import say
from commrt.diagnosis.departures import FAILED
from commrt.diagnosis.frames import is_user, short
from commrt.diagnosis.verdict import judge
from commrt.process.polling import poll
from commrt.transports import processes

_APPLIES = "the stall watch"
GATHER_S = settings.Seconds(
    3.0, "how long the judge waits for every rank's view of a stall", _APPLIES, settings.STALLS
)
PRINTED_S = settings.Seconds(
    3.0, "how long a rank waits for the others to print the verdict", _APPLIES, settings.STALLS
)


class Hearing:
    """One communicator's part in forming the verdict, once per process (module docs).

    ``client()`` opens a new connection to the job's store under the watch's prefix;
    ``stall_s`` is the watch's period (None: only a timeout declares a stall). Of
    ``watch`` it asks three things: ``where(failed)`` (this rank's position),
    ``idle_s()`` (the seconds since it last moved) and ``dropped()`` (the ranks a
    protocol dropped: reported so, never blamed)."""

    def __init__(self, client, rank: int, world_size: int, departures, stall_s, watch):
        self.client, self.rank, self.world_size = client, rank, world_size
        self.departures, self.stall_s = departures, stall_s
        self.where, self.idle_s, self.dropped = watch.where, watch.idle_s, watch.dropped
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.main = threading.main_thread().ident
        self._forming = threading.Lock()
        #: the verdict, once formed (:meth:`form`), and whether an error's message carries it
        self.verdict: dict | None = None
        self.told = False
        #: the store connection the verdict was formed through (where ranks say they printed)
        self.board = None

    def form(self, reason: str, failed: bool = False, told: bool = False) -> dict | None:
        """The verdict: publish this rank's view, then judge (the first rank to ask) or wait
        for the judge's. Once per process: a second caller waits for the first and gets
        the same verdict. None where the store failed (said on stderr). ``failed``: for an
        error this rank dies of (its position is where its last collective raised);
        ``told``: an error's message will carry the verdict."""
        with self._forming:
            self.told = self.told or told
            if self.verdict is None:
                try:
                    store = self.client()
                    store.add("declared", 1)
                    store.set(f"view/{self.rank}", json.dumps(self.view(reason, failed)))
                    if store.add("judge", 1) == 1:
                        verdict = self.judge_views(store)
                        store.set("verdict", json.dumps(verdict))
                    else:
                        verdict = self._wait_verdict(store)
                    self.verdict, self.board = verdict, store
                except Exception as e:  # the store died under us: say so
                    say(f"commrt: rank {self.rank}: no stall verdict ({e})")
                    return None
            return self.verdict

    def view(self, reason: str, failed: bool = False) -> dict:
        """What this rank says of itself (:mod:`commrt.diagnosis.verdict`'s view)."""
        frame = sys._current_frames().get(self.main)
        stack = traceback.extract_stack(frame) if frame is not None else []
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "state": "published",
            "position": self.where(failed),
            "idle_s": round(self.idle_s(), 1),
            "reason": reason,
            "stack": [[short(f.filename), f.lineno, f.name, is_user(f.filename)] for f in stack],
        }

    def judge_views(self, store) -> dict:
        """As the judge: wait for every rank's view (at most :data:`GATHER_S`; as long
        again for a rank that beat meanwhile), make up the missing ones (:meth:`_absent`),
        and return the verdict with the views."""
        ranks = range(self.world_size)
        before = {r: read(store, f"beat/{r}") for r in ranks}
        # a rank whose process is gone never answers: nobody waits for it. One that beat
        # since the stall was declared has seen it (a watch beats, then looks): its view is
        # on its way, however slow the machine (without it: NOT ANSWERING, on every rank)
        if not poll_store(lambda: all(self._answered(store, r) for r in ranks), GATHER_S):
            late = [r for r in ranks if _beat_of(before[r]) != _beat_of(read(store, f"beat/{r}"))]
            poll_store(lambda: all(self._answered(store, r) for r in late), GATHER_S)
        views, dropped = [], self.dropped()
        for r in ranks:
            view = read(store, f"view/{r}")
            if view is None:
                view = self._absent(r, before[r], read(store, f"beat/{r}"))
            views.append(view | ({"state": "dropped"} if r in dropped else {}))
        verdict = judge(views, self.stall_s)
        return verdict | {"views": views}

    def peer_gone(self, store, rank: int) -> bool:
        """Whether ``rank``'s process, on this host by its last heartbeat, is gone."""
        beat = read(store, f"beat/{rank}") or {}
        if beat.get("host") != self.host or not beat.get("pid"):
            return False  # another host's, or never beat: unknown
        return processes.gone(beat["pid"])

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
        if poll_store(lambda: store.check(["verdict"]), GATHER_S + 2 * PRINTED_S):
            return read(store, "verdict")
        return self.judge_views(store)  # the judge died on the way: judge here


def read(store, key: str):
    """The JSON value of ``key`` in ``store``; None where it is not there or unreadable."""
    try:
        return json.loads(bytes(store.get(key)).decode()) if store.check([key]) else None
    except (RuntimeError, ValueError):
        return None


def _beat_of(beat: dict | None):
    return None if beat is None else beat.get("beat")


def poll_store(done, timeout: float) -> bool:
    """``done()`` polled until true or ``timeout``: a verdict's waits ask the store at most
    every 50 ms, since every rank asks at once."""
    return poll(done, timeout, most_pause_s=0.05)
