"""Timelines: Chrome-trace (Perfetto) JSON per rank, and NVTX ranges on GPU.

A :class:`Tracer` records complete events (``"ph": "X"``) with wall-clock
microsecond timestamps, so the files of several ranks line up when merged
with :func:`merge_traces` (or ``commrt trace merge``). Open the result in
https://ui.perfetto.dev or chrome://tracing. With ``nvtx=True`` every span
is also an NVTX range, so Nsight Systems shows the same names.

Example::

    tracer = Tracer(rank=comm.rank)
    with tracer.span("commrt/bucket0/pack", bucket=0):
        ...
    tracer.save(f"trace.rank{comm.rank}.json")
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Iterable, Iterator


class Tracer:
    """Collects spans for one rank; cheap enough to leave on in training.

    Recording appends to a list (atomic under the GIL), so the training
    thread and commrt's progress thread can both record.
    """

    def __init__(self, rank: int = 0, *, nvtx: bool = False, process_name: str | None = None):
        self.rank = rank
        self.events: list[dict] = []
        self._wall0_us = time.time_ns() / 1e3
        self._perf0 = time.perf_counter()
        self._tids: dict[int, int] = {}
        self._thread_names: dict[int, str] = {}  # tid -> name given by name_thread
        self._nvtx = None
        if nvtx:
            import torch

            self._nvtx = torch.cuda.nvtx
        self.process_name = process_name or f"rank {rank}"

    def now_us(self) -> float:
        """Wall-clock time in µs, on the same clock as the recorded events."""
        return self._wall0_us + (time.perf_counter() - self._perf0) * 1e6

    def _tid(self) -> int:
        ident = threading.get_ident()
        tid = self._tids.get(ident)
        if tid is None:
            tid = self._tids.setdefault(ident, len(self._tids))
        return tid

    def name_thread(self, name: str) -> None:
        """Name the calling thread's row in the timeline (default: ``main`` for the first
        thread that records, ``commrt progress 1`` for the second)."""
        self._thread_names[self._tid()] = name

    def add(self, name: str, start_us: float, end_us: float, cat: str = "commrt", **args) -> None:
        """Record a complete event that was timed elsewhere."""
        ev = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": start_us,
            "dur": max(0.0, end_us - start_us),
            "pid": self.rank,
            "tid": self._tid(),
        }
        if args:
            ev["args"] = args
        self.events.append(ev)

    @contextlib.contextmanager
    def span(self, name: str, cat: str = "commrt", **args) -> Iterator[None]:
        """Time the body as one event (and one NVTX range on GPU)."""
        if self._nvtx is not None:
            self._nvtx.range_push(name)
        t0 = self.now_us()
        try:
            yield
        finally:
            self.add(name, t0, self.now_us(), cat, **args)
            if self._nvtx is not None:
                self._nvtx.range_pop()

    def instant(self, name: str, cat: str = "commrt", **args) -> None:
        ev = {
            "name": name,
            "cat": cat,
            "ph": "i",
            "s": "t",
            "ts": self.now_us(),
            "pid": self.rank,
            "tid": self._tid(),
        }
        if args:
            ev["args"] = args
        self.events.append(ev)

    def clear(self) -> None:
        self.events.clear()

    def to_chrome(self) -> dict:
        meta = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": self.rank,
                "tid": 0,
                "args": {"name": self.process_name},
            },
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": self.rank,
                "tid": 0,
                "args": {"sort_index": self.rank},
            },
        ]
        names = {0: "main"}
        for tid in self._tids.values():
            if tid:
                names[tid] = f"commrt progress {tid}" if tid == 1 else f"thread {tid}"
        names.update(self._thread_names)
        meta += [
            {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": n}}
            for tid, n in names.items()
        ]
        return {"traceEvents": meta + list(self.events), "displayTimeUnit": "ms"}

    def save(self, path: str | os.PathLike) -> str:
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_chrome(), f)
        os.replace(tmp, path)  # readers never see half a file
        return path


def _trace_events(path) -> list[dict]:
    """The events of one Chrome trace file (an object with ``traceEvents``, or a bare list);
    ``ValueError`` naming the file if it is not one."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{os.fspath(path)} is not a trace: not JSON ({e})") from None
    except IsADirectoryError:
        raise ValueError(
            f"{os.fspath(path)} is a folder, not a trace; give the trace files in it "
            f"(e.g. {os.path.join(path, '*.json')})"
        ) from None
    except PermissionError as e:  # commrt trace merge prints a ValueError as one line
        raise ValueError(f"cannot read {os.fspath(path)}: {e.strerror or e}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{os.fspath(path)} is not a trace: no traceEvents list")
    return events


def merge_traces(paths: Iterable[str | os.PathLike], out: str | os.PathLike) -> str:
    """Merge per-rank trace files into one (each rank stays its own process row)."""
    events: list[dict] = []
    n = 0
    for p in paths:
        events += _trace_events(p)
        n += 1
    if not n:
        raise ValueError("merge_traces needs at least one trace file")
    out = os.fspath(out)
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return out
