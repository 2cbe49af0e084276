"""What ``/proc`` says of a process on this host: its state letter (whether it has ended,
whether it is stopped), its start time, the processes under it and the shared memory it
maps, each rule written here once.

The shared-memory transport tells a dead peer from a live one by its pid and
start time, the stall watch tells a stopped rank from a busy one by its state,
and the launcher names a stopped rank; all three read ``/proc/<pid>/stat``
here.
"""

from __future__ import annotations

import os

#: state letters of a process that has ended: dead, or a zombie (dead, not yet reaped)
ENDED = frozenset({"Z", "X"})
#: state letters of a stopped process (SIGSTOP, a debugger)
STOPPED = frozenset({"T", "t"})
#: where mpich keeps its shared-memory segment for the ranks of a node
MPICH_SHM = "/dev/shm/mpich_shm_"


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


def descendants(pid: int) -> list[int]:
    """The processes under ``pid``: its children, theirs, and so on (mpiexec's ranks under
    its proxies); [] where there is no /proc."""
    try:
        names = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []
    children: dict[int, list[int]] = {}
    for child in names:
        fields = stat_fields(child)
        if fields is not None and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def unlink_mapped(prefix: str, pids=("self",)) -> None:
    """Unlink the files whose paths start with ``prefix`` that the processes ``pids`` map
    (this one by default): a segment in /dev/shm that its processes would have unlinked
    had they ended well. Their mappings outlive its name; files no process of ``pids``
    maps, another job's, are never touched."""
    paths = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths |= {line.split(None, 5)[-1].strip() for line in f if prefix in line}
        except OSError:  # gone already, or no /proc here: nothing we can find
            continue
    for path in paths:
        if path.startswith(prefix) and not path.endswith("(deleted)"):
            try:
                os.unlink(path)
            except OSError:  # another process was first
                pass
