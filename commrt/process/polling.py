"""Waiting on a store: ask ``done()`` with growing pauses until it holds or time runs out.

The job's control plane (:mod:`commrt.runtime.store`), the stall watch
(:mod:`commrt.diagnosis.stall`) and the rejoin and arrival waits of backup
workers and gossip all wait this way. A leaf: the stall watch sits below the
control store in the import order, so the wait cannot live in either.
"""

from __future__ import annotations

import time
from typing import Callable


def poll(
    done: Callable[[], bool],
    timeout: float,
    idle: Callable[[], None] | None = None,
    idle_every_s: float = 0.005,
    most_pause_s: float = 2e-3,
) -> bool:
    """Call ``done()`` (a store query) with growing pauses until it is true (True) or
    ``timeout`` seconds pass (False). Meanwhile ``idle()``, if given, runs at most every
    ``idle_every_s``: a rank may have work to do for the very ranks it waits for. The
    pauses grow to ``most_pause_s``."""
    deadline = time.monotonic() + timeout
    pause, next_idle = 0.0, 0.0
    while not done():
        now = time.monotonic()
        if now > deadline:
            return False
        if idle is not None and now >= next_idle:
            idle()
            next_idle = now + idle_every_s
        # a short first pause answers fast on one machine; a growing one spares the store
        time.sleep(pause)
        pause = min(most_pause_s, 2 * pause + 1e-4)
    return True
