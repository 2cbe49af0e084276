"""What torchrun learns of a failed job from commrt: the stall verdict in each rank's error
file, and a rank that torchrun stops while the verdict forms gives it first.

torchrun (``torch.distributed.elastic``) ends a job when one rank fails: it
sends the others SIGTERM (the default action kills at once), waits up to 30 s,
then SIGKILLs them, and prints a "Root Cause" block for the failure with the
smallest timestamp, read from the rank's error file
(``TORCHELASTIC_ERROR_FILE``, JSON as
``torch.distributed.elastic.multiprocessing.errors.ErrorHandler.record_exception``
writes it) or, without one, "Signal 9 (SIGKILL) received by PID ...".

* :func:`record_error`: what a rank writes there (a configuration error the torch
  backend refuses at the start goes there too, by :func:`record_error` itself);
* :func:`write_error_file`: every rank that gives the verdict writes it there,
  dated the second before the failure began (its root's last sign of life):
  torchrun's stamps are whole seconds, and a tie goes to the rank it noticed
  first (a killed rank's, which says only "Signal 9"), so the block torchrun
  names the root cause is commrt's verdict.
* :func:`guard_sigterm`: under torchrun, a SIGTERM that finds the job failing
  (a verdict forming in this process, a stall declared in the store, or a
  peer on this host dead: gone without a farewell) lets the verdict be given, and end the
  job, first; a survivor of a killed rank is stopped about 0.1 s after the
  death, before it could print. Any other SIGTERM (the job stopped from
  outside) ends the process as the default action does, at once. A program's
  own SIGTERM handler is left alone.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import threading
import time

from commrt import settings

#: torchrun's variables: its error file, and its run's id (present under torchrun alone)
ERROR_FILE, RUN_ID = "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID"
PRINT_WAIT_S = settings.Seconds(
    10.0,
    "how long a rank that torchrun stops (SIGTERM) waits for the verdict it gives to be "
    "printed (torchrun waits 30 s, then kills)",
    "a rank under torchrun",
    settings.STALLS,
)
SIGNAL_TAKES_S = settings.Seconds(
    5.0,
    "how long a rank that re-sends itself SIGTERM waits for it to end the process, before "
    "it exits with 143 itself",
    "torchrun's SIGTERM",
    settings.STALLS,
)


def write_error_file(verdict: dict, text: str) -> None:
    """Write ``text`` (``verdict``'s) to torchrun's error file where there is one, in the
    format of torch's ``ErrorHandler.record_exception``, dated the second before the failure
    began (module docs): when the verdict's root last moved, or last beat where it could
    not answer."""
    views = {v["rank"]: v for v in verdict.get("views", [])}
    idle_s = views.get(verdict.get("root"), {}).get("idle_s") or 0.0
    record_error(text, int(time.time() - idle_s) - 1)


def record_error(text: str, stamp: int | None = None) -> None:
    """Write ``text`` to torchrun's error file where there is one (its "Root Cause" block
    then shows it, not "To enable traceback see ..."), dated ``stamp`` (seconds; default
    now): the stall verdict, or a configuration error every rank raises at the start."""
    path = os.environ.get(ERROR_FILE)
    if not path:
        return
    stamp = str(int(time.time()) if stamp is None else stamp)
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text, "timestamp": stamp}}}
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)  # torchrun never reads half a file
    except OSError:  # torchrun's folder is gone: the job ends anyway
        pass


def guard_sigterm(watch) -> None:
    """Under torchrun, have a SIGTERM wait for ``watch``'s verdict where the job is failing
    (module docs). Only from the main thread (where Python sets signal handlers), where
    SIGTERM still has its default action and no other wake-up file is set; once per
    process (a later communicator's watch replaces the one guarded)."""
    if RUN_ID not in os.environ or threading.current_thread() is not threading.main_thread():
        return
    if _Guard.installed is not None:
        _Guard.installed.watch = watch
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program's own handler decides
    read, write = os.pipe()
    os.set_blocking(write, False)
    if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # asyncio's, say
        signal.set_wakeup_fd(-1)
        os.close(read), os.close(write)
        return
    _Guard.installed = _Guard(watch, read)
    # Python runs a handler on the main thread only, which may sit in a C call for long (a
    # gloo wait): the guard's thread reads the wake-up byte instead, at once
    signal.signal(signal.SIGTERM, lambda *_: None)


class _Guard:
    """The thread that answers SIGTERM (:func:`guard_sigterm`)."""

    installed: "_Guard | None" = None

    def __init__(self, watch, read: int):
        self.watch, self.read = watch, read
        # a daemon: it waits on a pipe, in no C++ call, and must not hold the exit
        threading.Thread(target=self._run, name="commrt-sigterm", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                got = os.read(self.read, 64)
            except OSError:
                return
            if signal.SIGTERM in got:
                self.answer()

    def answer(self) -> None:
        """Where the job is failing, the verdict's line first (given here, or by the thread
        that gives it already: at most :data:`PRINT_WAIT_S`); then, or at once where the
        job is not failing, end as SIGTERM does."""
        watch = self.watch
        if not watch.judging and watch.verdict is None:
            if not failing(watch):
                die_of_sigterm()
            watch.diagnose("torchrun stopped this rank (SIGTERM) after another rank failed")
        # the verdict is given here (by this thread or another): once its line is out, the
        # rest (waiting for the others to print, ending the job) is torchrun's to cut short
        watch.said.wait(PRINT_WAIT_S)
        die_of_sigterm()


def failing(watch) -> bool:
    """Whether, now, a stall was declared in the job's store, or a peer's process on this
    host (by its heartbeat) died: what a SIGTERM that follows a failure finds, and one
    that stops a healthy job does not (its peers die of the same signal, after it)."""
    try:
        store = watch.client()
        if store.check(["declared"]):
            return True
        peers = [r for r in range(watch.world_size) if r != watch.rank]
        return any(watch.peer_gone(store, r) and died(watch, r) for r in peers)
    except Exception:  # the store is gone: the job is ending, nothing to give
        return False


def died(watch, rank: int) -> bool:
    """Whether ``rank``, whose process is gone, died: it left no farewell (one that closed,
    exited or failed of its own error said so, and its own output says why)."""
    return watch.departures.farewell_of(rank) is None


def die_of_sigterm() -> None:
    """End this process as SIGTERM's default action does (torchrun reads -15), from any
    thread: C's ``signal()`` restores the default (Python's may only be called on the main
    thread), then the signal again; ``os._exit(143)`` where that fails."""
    try:
        ctypes.CDLL(None).signal(signal.SIGTERM, 0)  # 0: SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(SIGNAL_TAKES_S)
    finally:
        os._exit(128 + signal.SIGTERM)
