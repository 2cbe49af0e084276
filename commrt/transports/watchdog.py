"""A watchdog for calls that block in C code with no timeout of their own.

NCCL blocks without a bound in two places: creating a communicator (it
waits for every rank) and the first send/recv between two ranks (the
connection is set up inside ``groupEnd()``). A dead or mismatched peer
hangs the caller there, holding whatever locks it holds. :class:`Watchdog`
runs such a call with a timer: when the timer fires it calls
``on_expire`` (the transport aborts its communicator, which makes NCCL
return from the blocked call), and if the call still has not returned
``grace_s`` later it ends the process with the named error, so no rank
outlives its error stuck in C code.

Example::

    >>> with Watchdog(60.0, comm.abort, "rank 0: groupEnd (connect to rank 3)"):
    ...     nccl.groupEnd()                                   # doctest: +SKIP
    >>> # raises nothing itself: the caller checks ``fired`` afterwards
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable

#: seconds a call may stay blocked after ``on_expire`` before the process is ended
GRACE_S = 5.0


class Watchdog:
    """Call ``on_expire`` if the ``with`` block runs past ``timeout_s``; end the process if it
    is still running ``grace_s`` after that. ``fired`` says whether the timer went off."""

    def __init__(
        self,
        timeout_s: float,
        on_expire: Callable[[], object] | None,
        what: str,
        grace_s: float = GRACE_S,
        exit: Callable[[int], object] = os._exit,
    ):
        self.timeout_s, self.on_expire, self.what = timeout_s, on_expire, what
        self.grace_s, self._exit = grace_s, exit
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="commrt-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self.timeout_s):
            return
        self.fired = True
        if self.on_expire is not None:
            try:
                self.on_expire()
            except Exception as e:  # noqa: BLE001 (the process ends below if it stays stuck)
                print(f"commrt: watchdog: abort failed: {e!r}", file=sys.stderr, flush=True)
        if self._done.wait(self.grace_s):
            return
        print(
            f"commrt: {self.what} blocked for {self.timeout_s:g} s and did not return "
            f"{self.grace_s:g} s after the abort; ending the process",
            file=sys.stderr,
            flush=True,
        )
        self._exit(1)
