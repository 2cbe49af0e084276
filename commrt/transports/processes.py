"""What ``/proc`` says of a process on this host: its state letter (whether it has ended,
whether it is stopped) and its start time, each rule written here once.

The shared-memory transport tells a dead peer from a live one by its pid and
start time, the stall watch tells a stopped rank from a busy one by its state,
and the launcher names a stopped rank; all three read ``/proc/<pid>/stat``
here.
"""

from __future__ import annotations

#: state letters of a process that has ended: dead, or a zombie (dead, not yet reaped)
ENDED = frozenset({"Z", "X"})
#: state letters of a stopped process (SIGSTOP, a debugger)
STOPPED = frozenset({"T", "t"})


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state letter first),
    or None if there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None


def state(pid: int) -> str | None:
    """The state letter of process ``pid`` (R, S, D, T, Z...), or None if there is none."""
    fields = stat_fields(pid)
    return None if fields is None else fields[0]


def ended(letter: str | None) -> bool:
    """Whether a process with state ``letter`` (:func:`state`; None: no such process)
    has ended."""
    return letter is None or letter in ENDED


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger); False where unknown."""
    return state(pid) in STOPPED


def gone(pid: int) -> bool:
    """Whether process ``pid`` (on this host) has ended."""
    return ended(state(pid))


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of its stat), or None
    if it is gone or a zombie (dead, not yet reaped): with the pid, it names one process
    even after the pid is reused."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ENDED:
        return None
    return int(fields[19])
