"""``commrt train``'s start-up as rank 0 lives it: its phases, and a word when one is slow.

From the launch to the first step a rank starts its process and imports torch, meets the
others (the transport's connect), loads the data and builds the model, and broadcasts the
model's first parameters (GradientSync). On a busy machine that takes tens of seconds,
and the launcher's ``starting 2 ranks (shm)…`` was all a user saw. Rank 0 marks each
phase as it begins (:meth:`Startup.begin`); a phase still running :data:`SLOW_S` seconds
into the start-up is named on a line of its own, with the seconds since the launch, so a
slow start says what it is doing; the summary's start-up row gives each phase's seconds
(:meth:`Startup.breakdown`).

Imports no torch: its first phase is importing it.
"""

from __future__ import annotations

import sys
import threading
import time

from commrt import settings

SLOW_S = settings.Seconds(
    2.0,
    "seconds into the start-up from which rank 0 names each phase still running",
    "`commrt train`'s start-up",
    settings.COMMAND_LINE,
)
#: the phases, in order (the first begins at the launch)
PROCESSES = "processes and imports"
MEETING = "meeting the other ranks"
DATA = "data and model"
BROADCAST = "broadcasting the model"


class Startup:
    """The phases of one rank's start-up (module docs). ``launched``: the launch, in
    ``time.time()`` seconds; ``say``: whether this rank names slow phases (rank 0)."""

    def __init__(self, launched: float, say: bool, stream=None, slow_s: float = SLOW_S):
        self.launched, self.say, self.slow_s = launched, say, slow_s
        self.stream = stream if stream is not None else sys.stdout
        #: [name, began, ended] per phase, ``time.time()`` seconds; ended None while it runs
        self.phases: list[list] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def begin(self, name: str, now: float | None = None, named: bool = False) -> None:
        """Phase ``name`` begins (``now``, default the clock): the last one ends.
        ``named``: someone said it already (the launcher names the first phase)."""
        now = time.time() if now is None else now
        with self._lock:
            self._end(now)
            self.phases.append([name, now, None])
            if self.say and not named:
                # named once the start-up is slow_s old, if it still runs then
                delay = max(0.0, self.launched + self.slow_s - time.time())
                self._timer = threading.Timer(delay, self._name_it, args=(len(self.phases),))
                # never holds the exit (end() cancels it anyway): threads.DAEMONS
                self._timer.daemon, self._timer.name = True, "commrt-startup-note"
                self._timer.start()

    def end(self, now: float | None = None) -> float:
        """The start-up ends (the first step): its seconds since the launch."""
        now = time.time() if now is None else now
        with self._lock:
            self._end(now)
        return now - self.launched

    def _end(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.phases and self.phases[-1][2] is None:
            self.phases[-1][2] = now

    def _name_it(self, index: int) -> None:
        with self._lock:
            if len(self.phases) != index or self.phases[-1][2] is not None:
                return  # over already
            at = time.time() - self.launched
            print(f"  {at:5.1f} s  {self.phases[-1][0]}…", file=self.stream, flush=True)

    def breakdown(self) -> list[tuple[str, float]]:
        """Each ended phase and its seconds, in order."""
        return [(name, ended - began) for name, began, ended in self.phases if ended is not None]


def rank_startup(launched: float) -> Startup:
    """The start-up of this process, a rank of ``commrt train``: its first phase (the
    processes, ``import torch``) began at the launch, and the launcher named it (no thread
    of a rank could: loading torch's libraries holds the interpreter's lock); rank 0 names
    the later phases where they are slow."""
    from commrt.process.environment import detect_launch

    startup = Startup(launched, say=detect_launch().rank == 0)
    startup.begin(PROCESSES, now=launched, named=True)
    return startup


def launcher_line(nproc: int, backend: str) -> str:
    """What the launcher says as it starts the ranks: the first phase, named at once."""
    return f"starting {nproc} ranks ({backend}): {PROCESSES}…"
