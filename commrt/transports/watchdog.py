"""A watchdog for calls that block in C code with no timeout of their own.

NCCL blocks without a bound in two places: creating a communicator (it
waits for every rank) and the first send/recv between two ranks (the
connection is set up inside ``groupEnd()``). A dead or mismatched peer
hangs the caller there, holding whatever locks it holds. :class:`Watchdog`
runs such a call with a timer: when the timer fires it starts the
grace period and calls ``on_expire`` (the transport aborts its
communicator, which makes NCCL return from the blocked call) on a thread
of its own, and if the call still has not returned ``grace_s`` later it
ends the process with the named error, so no rank outlives its error stuck
in C code. The abort cannot hold that exit back: ``ncclCommAbort`` itself
can hang (:mod:`commrt.transports.bounded`), so the grace is counted from
the timer, not from the abort's return.

One watchdog thread serves every call of a transport: arming and
disarming it is a lock and a notify (microseconds), so it can guard every
``groupEnd`` on the hot path without starting a thread per call.

Example::

    >>> dog = Watchdog()
    >>> abort = lambda: None                                  # NCCL's abort, in use
    >>> with dog.guard(60.0, abort, "rank 0: groupEnd (connect to rank 3)") as w:
    ...     pass                                              # nccl.groupEnd()
    >>> w.fired          # the caller raises its named error when the timer went off
    False
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

from commrt import settings

GRACE_S = settings.Seconds(
    5.0,
    "how long an NCCL call may stay blocked after its timeout (and the abort started then) before "
    "the process ends",
    "NCCL calls that block in C code",
    settings.NCCL,
)


class GuardedCall:
    """One guarded call: ``fired`` says whether its timer went off."""

    def __init__(self, dog: "Watchdog", deadline: float, on_expire, what: str):
        self.dog, self.deadline, self.on_expire, self.what = dog, deadline, on_expire, what
        self.fired = self.done = False

    def __enter__(self) -> "GuardedCall":
        self.dog.arm(self)
        return self

    def __exit__(self, *exc) -> None:
        self.dog.disarm(self)


class Watchdog:
    """A thread that calls a guarded call's ``on_expire`` at its deadline, and ends the
    process (``exit(1)``) if the call is still running ``grace_s`` after that."""

    def __init__(self, grace_s: float = GRACE_S, exit: Callable[[int], object] = os._exit):
        self.grace_s, self._exit = grace_s, exit
        self._cv = threading.Condition()
        self._current: GuardedCall | None = None
        self._thread: threading.Thread | None = None

    def guard(self, timeout_s: float, on_expire, what: str) -> GuardedCall:
        """A context manager guarding one call for ``timeout_s`` seconds."""
        return GuardedCall(self, time.monotonic() + timeout_s, on_expire, what)

    def arm(self, w: GuardedCall) -> None:
        with self._cv:
            self._current = w
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="commrt-watchdog", daemon=True
                )
                self._thread.start()
            self._cv.notify_all()

    def disarm(self, w: GuardedCall) -> None:
        with self._cv:
            w.done = True
            if self._current is w:
                self._current = None
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                w = self._current
                while w is None or w.fired or time.monotonic() < w.deadline:
                    idle = w is None or w.fired
                    self._cv.wait(None if idle else w.deadline - time.monotonic())
                    w = self._current
                w.fired = True  # (a disarmed call is no longer current)
            self._expire(w)

    def _expire(self, w: GuardedCall) -> None:
        end = time.monotonic() + self.grace_s  # counted before the abort, which may hang
        if w.on_expire is not None:
            threading.Thread(
                target=_call_on_expire, args=(w,), name="commrt-watchdog-abort", daemon=True
            ).start()
        with self._cv:
            while not w.done and time.monotonic() < end:
                self._cv.wait(end - time.monotonic())
            if w.done:
                return
        print(
            f"commrt: {w.what} blocked past its timeout and did not return within "
            f"{self.grace_s:g} s of it (the abort started then); ending the process",
            file=sys.stderr,
            flush=True,
        )
        self._exit(1)


def _call_on_expire(w: GuardedCall) -> None:
    """``w.on_expire()``, on a thread of its own: the watchdog's exit must not wait for it."""
    try:
        w.on_expire()
    except Exception as e:  # noqa: BLE001 (the process ends if the call stays stuck)
        print(f"commrt: watchdog: abort failed: {e!r}", file=sys.stderr, flush=True)
