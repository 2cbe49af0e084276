"""What commrt's process group did: stats, a first-sight log line, a trace.

Under DDP the backend's calls are torch's, not the user's, so what each ran
is shown three ways (``docs/from-ddp.md``, "Seeing what commrt did"):

* **stats**, always kept: :func:`commrt.distributed.stats` gives the
  group's :class:`GroupStats`, one :class:`CallStats` per (op, size, dtype)
  of its calls, collectives and point-to-point alike (``send``/``recv``,
  what ``batch_isend_irecv`` and pipelining issue: seconds from the call's
  start to its completion): calls, bytes, seconds the calls took, the
  algorithm each call ran
  (``auto:ring`` when ``auto`` chose ring) and why ``auto`` chose it.
* **a log line** the first time each (op, size, dtype) is seen, with
  ``COMMRT_LOG=info`` (or torch's ``TORCH_DISTRIBUTED_DEBUG=INFO`` or
  ``DETAIL``): printed by the group's rank 0 only, as every rank runs the
  same schedule (``auto``'s choices are agreed across ranks);
  ``COMMRT_LOG=debug`` prints it on every rank.
* **a trace** with ``COMMRT_TRACE=DIR``: ``DIR/rank<global rank>.json``,
  the Chrome-trace (Perfetto) format of :class:`commrt.runtime.trace.Tracer`,
  as ``commrt train --trace`` writes it, so ``commrt trace merge`` merges
  the ranks' files. One span a call on the thread that ran it (the
  group's call thread ``commrt-pg-<group>``, or the caller's:
  :meth:`commrt.distributed.work.CallQueue.submit`), the schedule's steps
  inside it. Written when the group is destroyed and at
  exit (not when the job is ended by an error: ``os._exit`` runs no exit
  handler).
"""

from __future__ import annotations

import atexit
import os
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field

from commrt import settings
from commrt.algorithms.auto import status
from commrt.process.environment import log_level
from commrt.runtime.trace import Tracer
from commrt.sim.links import fmt_bytes

#: the calls whose body runs a schedule through the communicator's executor (so its last
#: schedule is what they ran); the others are point-to-point groups or a barrier
SCHEDULED = ("allreduce", "reduce", "broadcast", "allgather", "all_gather", "reduce_scatter")
WIDTH = 80
#: how ``auto``'s note starts while it learns (commrt.algorithms.auto.status)
LEARNING = ("auto: learning", "auto: rechecking")


@dataclass
class CallStats:
    """One (op, size, dtype) of a group's calls."""

    op: str  #: torch's call and its reduction, e.g. ``allreduce(sum)``
    nbytes: int  #: bytes of the call's tensors (a DDP bucket's size)
    dtype: str
    calls: int = 0
    #: seconds the calls took (the collective itself, on the thread that ran it)
    seconds: float = 0.0
    #: seconds of the first call, which also agrees the call across ranks and, under
    #: ``auto``, probes the network: :attr:`per_call_s` leaves it out
    first_seconds: float = 0.0
    #: calls per schedule that ran (``auto`` tries a runner-up before it settles)
    ran: dict = field(default_factory=dict)
    #: what the calls run, e.g. ``auto:ring``; while ``auto`` learns, what it runs between
    #: its trial's blocks (``""``: no schedule: a p2p call)
    algorithm: str = ""
    #: why: ``auto``'s choice with its predicted time and the runners-up, or while it
    #: learns what it runs meanwhile and is timing against it (else ``""``)
    why: str = ""
    #: the schedule the last call ran (a trial's candidate, while ``auto`` learns)
    ran_last: str = ""
    #: whether ``auto`` is still learning (or rechecking) for these calls: :attr:`why` says
    #: so, and what it runs meanwhile, which :attr:`algorithm` names too
    learning: bool = False
    #: the transport the calls went over: ``shm``, ``gloo``, ``mpi`` or ``nccl``
    transport: str = ""

    def count(self, seconds: float) -> None:
        """One more call, which took ``seconds`` (the first is also kept apart)."""
        self.calls += 1
        self.seconds += seconds
        if self.calls == 1:
            self.first_seconds = seconds

    @property
    def bytes(self) -> int:
        """Bytes of every call's tensors together."""
        return self.nbytes * self.calls

    @property
    def per_call_s(self) -> float:
        """Mean seconds a call after the first (the first alone if it is the only one)."""
        if self.calls > 1:
            return (self.seconds - self.first_seconds) / (self.calls - 1)
        return self.seconds


@dataclass
class GroupStats:
    """A commrt process group's calls (:func:`commrt.distributed.stats`).

    Example::

        >>> s = commrt.distributed.stats()               # after DDP trained a while
        >>> s.algorithms                                 # doctest: +SKIP
        ('binomial_tree', 'auto:ring')
        >>> print(s)                                     # a table, 80 columns
        commrt group ...
    """

    rank: int
    world_size: int
    group: str
    #: (op, nbytes, dtype) -> CallStats, in the order first seen
    entries: dict = field(default_factory=dict)

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The algorithms the calls ran, each once, in the order first seen."""
        return tuple(dict.fromkeys(a for e in list(self.entries.values()) for a in e.ran))

    @property
    def transports(self) -> tuple[str, ...]:
        """The transports the calls went over, each once, in the order first seen."""
        return tuple(dict.fromkeys(e.transport for e in list(self.entries.values())))

    @property
    def calls(self) -> int:
        return sum(e.calls for e in list(self.entries.values()))

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in list(self.entries.values()))

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in list(self.entries.values()))

    def find(self, op: str) -> list[CallStats]:
        """The entries whose op starts with ``op`` (``"allreduce"``: every reduction)."""
        return [e for e in list(self.entries.values()) if e.op.startswith(op)]

    def summary(self) -> str:
        head = (
            f"commrt group {self.group}, rank {self.rank} of {self.world_size}: "
            f"{self.calls} calls, {fmt_bytes(self.bytes)}, {self.seconds * 1e3:.1f} ms"
        )
        if self.transports:
            head += f" over {', '.join(self.transports)}"
        rows = [("op", "size", "dtype", "calls", "ms/call", "algorithm")]
        # a row of one call, whose time is its set-up's too, is marked (decimals aligned)
        lone = any(e.calls == 1 for e in list(self.entries.values()))
        for e in list(self.entries.values()):
            per = f"{e.per_call_s * 1e3:.3f}" + ("*" if e.calls == 1 else " " * lone)
            rows.append((e.op, fmt_bytes(e.nbytes), e.dtype, str(e.calls), per, e.algorithm))
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        lines = [head]
        for r in rows:
            cells = [r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2])]
            cells += [r[3].rjust(widths[3]), r[4].rjust(widths[4]), r[5]]
            lines.append("  ".join(cells).rstrip())
        if lone:
            lines.append(_wrap(f"* {LONE_CALL}", ""))
        whys = dict.fromkeys(e.why for e in list(self.entries.values()) if e.why)
        return "\n".join(lines + [_wrap(w, "") for w in whys])

    def __str__(self) -> str:
        # a newline at the end: each rank's print is then whole lines (under torchrun or
        # mpiexec, two ranks' tables otherwise ran together mid-line)
        return self.summary() + "\n"


#: the note under a row of one call: ms/call leaves the first call out where it can
LONE_CALL = (
    "one call only: its time includes its set-up (the check of the call across ranks; "
    "under auto, the network probe), which later calls do without"
)


def _wrap(text: str, prefix: str) -> str:
    return textwrap.fill(
        text, WIDTH, initial_indent=prefix + "  ", subsequent_indent=prefix + "    "
    )


class _Traces:
    """The process's tracer for ``COMMRT_TRACE`` (every commrt group of a process records
    into one file, named after the global rank) and its saving at exit."""

    lock = threading.Lock()
    tracer: Tracer | None = None
    path: str | None = None

    @classmethod
    def get(cls, global_rank: int) -> Tracer | None:
        folder = settings.TRACE.text()
        if not folder:
            return None
        with cls.lock:
            if cls.tracer is None:
                try:  # a folder it cannot write is refused when the group is made
                    os.makedirs(folder, exist_ok=True)
                except OSError as e:
                    why = e.strerror or e
                    raise ValueError(
                        f"{settings.TRACE.name}={folder}: cannot make that folder ({why})"
                    ) from None
                if not os.access(folder, os.W_OK | os.X_OK):
                    raise ValueError(
                        f"{settings.TRACE.name}={folder}: this process cannot write there"
                    )
                cls.tracer = Tracer(rank=global_rank)
                cls.path = os.path.join(folder, f"rank{global_rank}.json")
                atexit.register(cls.save)
            return cls.tracer

    @classmethod
    def save(cls) -> None:
        with cls.lock:
            if cls.tracer is not None and cls.path is not None:
                cls.tracer.save(cls.path)


def process_tracer(global_rank: int) -> Tracer | None:
    """The tracer this process's commrt groups record into (None without
    ``COMMRT_TRACE``); its file is saved when a group shuts down and at exit."""
    return _Traces.get(global_rank)


def save_traces() -> None:
    """Write the process's trace file now (nothing without ``COMMRT_TRACE``)."""
    _Traces.save()


class Observer:
    """Runs each of a group's calls and records what it ran (module docs)."""

    def __init__(self, rank: int, world_size: int, group: str, tracer: Tracer | None):
        self.stats = GroupStats(rank, world_size, group)
        self.level = log_level()
        self.prefix = "commrt: " if self.level != "debug" else f"commrt: rank {rank}: "
        self.speaks = self.level == "debug" or (self.level == "info" and rank == 0)
        self.tracer = tracer
        self.named: set[int] = set()  # threads whose row in the trace has its name
        #: point-to-point calls complete on the callers' threads, beside the call thread
        self.lock = threading.Lock()

    def run(self, what: str, tensors: list, run, dc) -> None:
        """``run(dc)`` (one call), then record it, on the thread that runs the call (calls
        run one at a time: :class:`commrt.distributed.work.CallQueue`)."""
        comm = dc.comm
        tracer = self.tracer
        t0_us = tracer.now_us() if tracer is not None else 0.0
        t0 = time.perf_counter()
        run(dc)
        seconds = time.perf_counter() - t0
        nbytes = sum(t.nbytes for t in tensors)
        ran = ""
        if what.startswith(SCHEDULED) and nbytes and comm.world_size > 1:
            sched = comm.executor.last_schedule
            ran = sched.name if sched is not None else ""
        dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else "-"
        entry = self._entry(what, nbytes, dtype, ran, comm)
        entry.count(seconds)
        if ran:
            entry.ran[ran] = entry.ran.get(ran, 0) + 1
            # a first call, or auto while it learns: its row and note from one state
            if ran != entry.ran_last or entry.learning:
                entry.ran_last = ran
                entry.algorithm, entry.why = _shown(ran, nbytes, comm)
                entry.learning = entry.why.startswith(LEARNING)
        if tracer is not None:
            here = threading.get_ident()
            if here not in self.named:  # the call thread, or a caller a call ran on
                tracer.name_thread(threading.current_thread().name)
                self.named.add(here)
            tracer.add(
                f"commrt/{what}",
                t0_us,
                tracer.now_us(),
                bytes=nbytes,
                dtype=dtype,
                algorithm=ran or "-",
                group=self.stats.group,
            )

    def p2p(self, what: str, tensor, comm, seconds: float) -> None:
        """Record a ``send`` or ``recv`` of ``tensor`` over ``comm`` that took ``seconds``
        (on the thread that completed it)."""
        dtype = str(tensor.dtype).replace("torch.", "")
        with self.lock:
            self._entry(what, tensor.nbytes, dtype, "", comm).count(seconds)

    def _entry(self, what: str, nbytes: int, dtype: str, ran: str, comm) -> CallStats:
        key = (what, nbytes, dtype)
        entry = self.stats.entries.get(key)
        if entry is not None:
            return entry
        entry = self.stats.entries[key] = CallStats(what, nbytes, dtype)
        entry.transport = comm.transport.name
        if self.speaks:
            self._say(entry, *_shown(ran, nbytes, comm))
        return entry

    def _say(self, entry: CallStats, ran: str, why: str) -> None:
        p = self.stats.world_size
        line = f"{self.prefix}{entry.op} of {entry.nbytes} B {entry.dtype} on {p} ranks"
        line += f": {ran}" if ran else ""
        text = line + ("\n" + _wrap(why, "") if why else "")
        print(text, file=sys.stderr, flush=True)


def _shown(ran: str, nbytes: int, comm) -> tuple[str, str]:
    """The row's algorithm and the note for calls of ``nbytes`` that last ran ``ran``: for
    ``auto``, both from :func:`commrt.algorithms.auto.status` (what it runs meanwhile while
    it learns, never the candidate a trial happens to be timing)."""
    if not ran.startswith("auto:"):
        return ran, ""
    row, why = status(comm, nbytes)
    return (row or ran), why
