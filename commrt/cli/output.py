"""When the reader of a command's output goes away (``commrt train | head -2``): the
command ends quietly, as a Unix command does, with exit status :data:`READER_LEFT`.

Python turns the write into a ``BrokenPipeError`` wherever it happens: in the progress
bar's thread, in the main loop, in the launcher. Left alone, each prints a traceback, and
a rank that dies of one makes its peers fail loudly too. Here the command's stdout is
wrapped (:func:`guarding_stdout`) so that the first failed write ends the process at once,
with nothing on stderr: a single process (``commrt simulate``, ``commrt diagnose``)
exits; a rank of ``commrt train`` waits for its launcher, which shares the same pipe,
sees the reader gone (:func:`reader_left`) and stops every rank together, so that no
rank sees a peer vanish and says so.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import sys
import time

from commrt import settings
from commrt.transports.processes import MPICH_SHM, descendants, unlink_mapped

#: the exit status when the reader left: 128 + SIGPIPE, what a shell shows for ``cat``
#: or ``yes`` cut short by ``head``, so that a script under ``set -o pipefail`` tells a
#: cut-short run from a finished one
READER_LEFT = 141

READER_WAIT_S = settings.Seconds(
    10.0,
    "how long a rank whose reader left waits for its launcher to stop the job before it "
    "ends by itself",
    "`commrt train` into a reader that leaves (`head`)",
    settings.COMMAND_LINE,
)

#: what this process knows: whether the reader left, and whether it supervises ranks
#: (the launcher, which then stops them instead of exiting at once)
_state = {"gone": False, "supervising": False}


class _ReaderGuarded:
    """A text stream whose failed write or flush (the reader left) calls :func:`_gone`;
    everything else is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _gone()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarding_stdout():
    """Inside, ``sys.stdout`` is wrapped (once) so that the reader's leaving ends this
    command quietly; after, it is the stream it was (a caller that runs the command in its
    own process, a test, keeps its stdout as it was)."""
    previous = sys.stdout
    if previous is not None and not isinstance(previous, _ReaderGuarded):
        sys.stdout = _ReaderGuarded(previous)
    try:
        yield
    finally:
        if isinstance(sys.stdout, _ReaderGuarded) and not isinstance(previous, _ReaderGuarded):
            sys.stdout = previous


def supervising() -> None:
    """Say that this process supervises ranks: where its reader leaves, it goes on until
    its loop stops them (:func:`reader_left`), instead of exiting at once."""
    _state["supervising"] = True


def reader_left() -> bool:
    """Whether the reader of this process's stdout has gone: a write failed already, or
    stdout is a pipe whose reading end is closed (``poll`` says POLLERR). Once seen,
    stdout is /dev/null from then on, so that no later write or flush fails."""
    if not _state["gone"] and _closed_pipe(1):
        _silence()
    return _state["gone"]


def stop_quietly(procs, stop) -> int:
    """The launcher's answer to a reader that left: ``stop(procs)`` every rank at once,
    say nothing, and return :data:`READER_LEFT`. Rank 0, which hosts the store, goes last:
    a rank that outlived it would report its loss. mpiexec's ranks, stopped, would leave
    mpich's segment in /dev/shm: it is unlinked first."""
    unlink_mapped(MPICH_SHM, [d for p in procs for d in descendants(p.pid)])
    stop(procs[::-1])
    return READER_LEFT


def _closed_pipe(fd: int) -> bool:
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poll = select.poll()
        poll.register(fd, 0)  # POLLERR is reported whatever the mask asks
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll() on this system
        return False


def _silence() -> None:
    """Point stdout at /dev/null and remember that the reader left."""
    _state["gone"] = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _gone() -> None:
    """A write failed because the reader left: the launcher goes on (its loop stops the
    ranks); a rank of ``commrt train`` waits for the launcher to stop it (a rank that
    ended first would make its peers report a lost peer); any other process exits."""
    _silence()
    if _state["supervising"]:
        return
    if settings.LAUNCHED.text():
        time.sleep(READER_WAIT_S)
    os._exit(READER_LEFT)
