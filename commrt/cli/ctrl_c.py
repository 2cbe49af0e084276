"""How the ranks a launcher starts meet a Ctrl-C: they leave it to the launcher, or end
with status 130 without a word, never with a traceback per rank.

The terminal sends a Ctrl-C to the whole foreground process group: the launcher and every
rank. Ranks started as subprocesses ignore it (:func:`deaf_to_ctrl_c`) and the launcher
stops them. mpiexec passes it on to its ranks as SIGINT, so a rank started by mpiexec
(:func:`quiet_rank_cmd`) ends itself with 130 when it arrives, whatever it was doing;
the launcher passes it on again to any that missed it (:func:`pass_on_again`).
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import Sequence

#: how a rank starts under mpiexec, which passes a Ctrl-C on to the ranks as SIGINT: it
#: ends the rank at once and quietly (see launch.interrupted()), even in ``import torch`` or in
#: Python's own start-up, where a KeyboardInterrupt prints a traceback per rank. sh
#: ignores SIGINT, and a bare ``python -S`` blocks it (held, not lost) and execs the rank,
#: which exits with 130 on the SIGINT once it has set that up and unblocked it
_QUIET_CTRL_C = (
    "import os, signal; signal.signal(signal.SIGINT, lambda *_: os._exit(130)); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); "
    "import runpy; runpy.run_module('commrt', run_name='__main__', alter_sys=True)"
)
_HOLD_CTRL_C = (
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT]); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    f"os.execv(sys.executable, [sys.executable, '-c', {_QUIET_CTRL_C!r}, *sys.argv[1:]])"
)


def quiet_rank_cmd(argv: Sequence[str]) -> list[str]:
    """The command that runs ``python -m commrt <argv>`` as a rank under mpiexec."""
    return [
        "/bin/sh",
        "-c",
        'trap "" INT; exec "$@"',
        "sh",
        sys.executable,
        "-S",
        "-c",
        _HOLD_CTRL_C,
        *argv,
    ]


@contextlib.contextmanager
def deaf_to_ctrl_c():
    """Processes started inside ignore SIGINT for life: an ignored signal stays ignored
    across exec, and Python then sets up no KeyboardInterrupt. The terminal sends a
    Ctrl-C to the whole process group; the launcher alone answers it (SIGTERM to the
    ranks, which end without a word) instead of each rank printing a traceback from
    wherever it was, ``import torch`` included. (A Ctrl-C in the moment of a start is
    lost; the next one works.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def pass_on_again(procs: list[subprocess.Popen]) -> None:
    """Send SIGINT again to the ranks under ``procs`` (mpiexec) still running. A rank that
    mpiexec started in the very moment of the Ctrl-C ignored it (sh, before ``python -S``
    held it) and would go on; once running, it ends with 130 like the others. Ranks are
    told by their command line, :func:`quiet_rank_cmd`'s, not by their place under
    mpiexec's proxies."""
    from commrt.transports.processes import descendants

    for p in procs:
        for pid in descendants(p.pid) if p.poll() is None else ():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
                if _QUIET_CTRL_C.encode() in args:
                    os.kill(pid, signal.SIGINT)
            except OSError:  # it ended meanwhile
                pass
