"""Calls into NCCL that may never return, made with a bound.

Three of NCCL's calls can block without end, in C code, where no Python
timeout reaches them:

* ``ncclCommAbort`` can hang: within a node every rank must abort
  (NVIDIA/nccl#863), and an abort can wait on a stuck proxy thread
  (NVIDIA/nccl#1777);
* ``ncclCommDestroy`` waits for the communicator's pending work and, being
  collective, for the other ranks;
* cupy's ``NcclCommunicator.__dealloc__`` calls ``destroy()`` when the
  object is garbage-collected, on whatever thread happens to collect it.

:func:`call_bounded` runs such a call on a daemon thread and gives up on it
after a bound, so the caller always goes on (a daemon thread still stuck
in C code does not keep the process from exiting). An object whose call
never returned is handed to :func:`keep_forever`: it is never deallocated,
so cupy's ``__dealloc__`` never calls ``destroy()`` on it a second time,
at a garbage collection or at interpreter exit.

Example::

    >>> call_bounded(comm.abort, ABORT_S, "abort")      # doctest: +SKIP
    True
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Callable

from commrt import settings

ABORT_S = settings.Seconds(
    10.0,
    "how long an abort may take before the caller goes on without it",
    "NCCL's abort",
    settings.NCCL,
)
DESTROY_S = settings.Seconds(
    10.0, "how long a healthy close lets `ncclCommDestroy` take", "NCCL's close", settings.NCCL
)


def call_bounded(fn: Callable[[], object], seconds: float, what: str) -> bool:
    """Run ``fn()`` on a daemon thread and wait at most ``seconds`` for it.

    Returns True if it returned in time (its error, if it raised one, is raised here),
    False if it is still running (it goes on alone) or no thread could be started (the
    interpreter is shutting down: then ``fn`` is not called at all). ``seconds`` 0 starts
    it and returns at once."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # handed to the caller
            errors.append(e)
        finally:
            done.set()

    if sys.is_finalizing():  # a thread started now never runs (Python 3.11 waits for it)
        return False
    try:
        threading.Thread(target=run, name=f"commrt-bounded-{what}", daemon=True).start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown" (3.12)
        return False
    if not done.wait(seconds):
        return False
    if errors:
        raise errors[0]
    return True


def keep_forever(obj: object) -> None:
    """Never deallocate ``obj``: one reference is taken that nothing gives back, so neither
    a garbage collection nor the interpreter's exit runs its destructor (cupy's would call
    ``ncclCommDestroy`` on a communicator whose abort or destroy never returned)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def warn(message: str) -> None:
    """One line on stderr: a call given up on is not an error of its own, but it is said."""
    print(f"commrt: {message}", file=sys.stderr, flush=True)
