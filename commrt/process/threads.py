"""Torch's CPU threads when several ranks share a node's cores.

Why
---
Every rank's torch starts one intra-op thread per core. With L ranks on a
node of C cores that is L·C threads, and OpenMP's idle threads spin before
they sleep, on the very cores a peer needs to send what this rank waits
for. A reduction's ``add_`` above torch's grain size (32K elements) wakes
them at every step, so every step of a collective waits behind threads
that have nothing to do: oversubscribed, an all-reduce runs several
times slower than with one thread per rank.

torchrun and ``commrt train`` set ``OMP_NUM_THREADS`` before the ranks
start, so they never meet this; a launch by hand, a batch script or an
MPI whose processes get every core can. So every
:class:`~commrt.Communicator` (``commrt.init()`` and the ``"commrt"``
torch.distributed backend) does what torchrun does, after the fact: where
the launcher says how many ranks share the node (``LOCAL_WORLD_SIZE``,
MPI's local size) and nobody set ``OMP_NUM_THREADS``, it gives each rank
``max(1, C // L)`` threads and warns once, saying so. Set
``OMP_NUM_THREADS`` (to any value) to keep your own. Where the launcher
does not say (``torch.multiprocessing.spawn`` with ``rank=`` and
``world_size=``), nothing changes: set it yourself.

Also here: the rule for the threads commrt runs beside the program (the
stall watch, backup workers' heartbeat and waiter, the progress and call
threads): each is a :func:`background_thread`, not a daemon, and its loop
ends once the program does. The exemptions, the daemon threads, are listed
in :data:`DAEMONS` with the reason each has (tests/unit/test_house.py holds
every thread commrt makes to the rule or to that list).
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from typing import Callable, Mapping

import torch

from commrt import settings

__all__ = ["threads_for", "usable_cores", "fit_torch_threads", "one_core_each"]

IDLE_CHECK_S = settings.Seconds(
    0.2,
    "how often an idle background thread (the torch backend's call thread, GradientSync's "
    "progress thread, gossip's and backup workers' waiters) looks whether the program is ending, "
    "so that it ends with it",
    "commrt's threads beside the program",
    settings.POLLING,
)


def threads_for(local_size: int | None, threads: int, cores: int) -> int | None:
    """Intra-op threads for each of ``local_size`` ranks on ``cores`` cores that now use
    ``threads`` each, or None where they fit (or the node's ranks are unknown)."""
    if local_size is None or local_size < 2 or local_size * threads <= cores:
        return None
    share = max(1, cores // local_size)
    return share if share < threads else None  # one thread each is all there is to give


def usable_cores() -> int:
    """Cores this process may run on (its affinity where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def one_core_each(local_size: int | None) -> bool:
    """Whether the ``local_size`` ranks on this node have one of this process's cores each,
    or less: then a thread of a rank can only take turns with the rank's other threads.
    False where the launcher does not say how many ranks share the node."""
    return local_size is not None and usable_cores() <= local_size


def fit_torch_threads(local_size: int | None, env: Mapping[str, str] | None = None) -> int | None:
    """Give this rank its share of the node's cores (module doc); the new thread count, or
    None if it left torch alone (``OMP_NUM_THREADS`` set, or nothing oversubscribed)."""
    env = os.environ if env is None else env
    if "OMP_NUM_THREADS" in env:
        return None
    had, cores = torch.get_num_threads(), usable_cores()
    n = threads_for(local_size, had, cores)
    if n is None:
        return None
    torch.set_num_threads(n)
    warnings.warn(
        f"commrt: {local_size} ranks share this node's {cores} cores and each had {had} torch "
        f"threads; set to {n} (idle threads spin on the cores a peer needs and slow every "
        f"collective). Set OMP_NUM_THREADS to choose yourself, as torchrun does.",
        RuntimeWarning,
        stacklevel=3,
    )
    return n


#: The rule's exemptions: commrt's daemon threads, by name (a name ending in "-" is a
#: prefix), and why each is one. A daemon thread that comes back from C++ while the
#: interpreter shuts down aborts the process (:func:`background_thread`); a non-daemon one
#: holds the exit until it ends. So a thread is a daemon only where holding the exit would be
#: worse (it may sit in a call that never returns) or where it never calls into C++.
DAEMONS = {
    "commrt-watchdog": "watches a guarded NCCL call past its deadline, then ends the process "
    "if the abort does not free it: it must run while the main thread is stuck in C++ for "
    "good, and never hold an exit (commrt.transports.watchdog)",
    "commrt-watchdog-abort": "calls ncclCommAbort, which can hang: a non-daemon would hold the "
    "exit forever (commrt.transports.watchdog)",
    "commrt-bounded-": "runs ncclCommAbort or ncclCommDestroy within a bound and is given up on "
    "past it; still stuck, it must not hold the exit (commrt.transports.bounded)",
    "commrt-sigterm": "reads SIGTERM's wake-up byte from a pipe: in no C++ call, and it must "
    "not hold the exit (commrt.process.elastic)",
    "commrt-startup-note": "a timer that names a slow start-up's phase: a print, no C++; "
    "cancelled when the start-up ends (commrt.cli.startup)",
}


def daemon_reason(name: str) -> str | None:
    """Why the thread named ``name`` may be a daemon (:data:`DAEMONS`), or None: it may not."""
    for key, why in DAEMONS.items():
        if name == key or (key.endswith("-") and name.startswith(key)):
            return why
    return None


def background_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A thread (not started) for commrt's work beside the program that calls into C++:
    store calls, gloo waits. Not a daemon: a daemon thread that comes back from C++ while
    the interpreter shuts down aborts the process ("terminate called without an active
    exception"). So ``target``'s loop must end once :func:`program_ending` says so (an
    idle loop looks every :data:`IDLE_CHECK_S`: :func:`next_job`), and the interpreter's
    exit waits for that, in a program that never closes what runs it. A call the thread
    is in when the program ends runs to its end first: a gloo wait cannot be cut short
    (a second wait on a work that timed out never returns), so the exit waits at most
    until that call's deadline (its timeout), and at once when its peers finish it or
    leave."""
    # daemon=False said outright: a thread inherits its maker's flag, and some are made on
    # GradientSync's progress thread, a daemon
    return threading.Thread(target=target, name=name, daemon=False)


def program_ending() -> bool:
    """Whether the main thread has ended: a :func:`background_thread`'s loop stops then."""
    return not threading.main_thread().is_alive()


def idle_wait(cv: threading.Condition) -> bool:
    """One wait of a :func:`background_thread`'s idle loop on ``cv`` (held by the caller):
    False once the program has ended with nothing notified, so that the loop ends; True
    otherwise (notified, or woken to look again)."""
    return cv.wait(IDLE_CHECK_S) or not program_ending()


def next_job(jobs: queue.SimpleQueue | queue.Queue):
    """The next item of ``jobs`` for a :func:`background_thread`'s loop, or None once the
    program has ended and nothing is queued (what was queued before still runs)."""
    while True:
        try:
            return jobs.get(timeout=IDLE_CHECK_S)
        except queue.Empty:
            if program_ending():
                return None
