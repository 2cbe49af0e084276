"""A schedule compiled for one rank and one buffer: its messages, cut into pieces.

:func:`compile_plan` turns the ranges of a :class:`~commrt.schedule.Schedule`'s
steps into element ranges of a flat buffer, each large range cut into
pieces of at most ``piece_elems`` (each piece its own message), and says
which receives land in a scratch buffer first (a sum, or a copy into a range
that a send of the same step still reads) and after how many of the step's
sends each may be written back. The executor (:mod:`commrt.schedule.executor`)
binds a plan to buffers and runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from commrt.schedule import OpKind, Schedule, chunk_bounds


@dataclass(frozen=True)
class Xfer:
    """One message of one step: elements ``[start, stop)`` of the buffer."""

    peer: int
    start: int
    stop: int
    piece: int
    reduce: bool = False
    scratch: int = -1  # offset in the scratch buffer, -1 = straight into the buffer


@dataclass(frozen=True)
class StepPlan:
    index: int
    phase: str
    sends: tuple[Xfer, ...]
    recvs: tuple[Xfer, ...]
    #: per receive: how many of this step's sends (in order) must have left before its data
    #: is written back into the buffer (a sum, or a copy via scratch, where a send reads)
    after_sends: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """A schedule compiled for one rank and one buffer shape."""

    steps: tuple[StepPlan, ...]
    scratch_numel: int
    group_size: int
    num_steps: int
    send_elems: int  # elements this rank sends over the whole schedule


def _pieces(start: int, stop: int, piece: int):
    a = start
    k = 0
    while a < stop:
        b = min(stop, a + piece)
        yield k, a, b
        a, k = b, k + 1


def overlaps(a0: int, a1: int, ranges) -> bool:
    return any(a0 < b1 and b0 < a1 for b0, b1 in ranges)


def _last_overlap(a0: int, a1: int, xfers) -> int:
    """1 + the index of the last transfer overlapping ``[a0, a1)``, 0 if none does."""
    return max((j + 1 for j, x in enumerate(xfers) if a0 < x.stop and x.start < a1), default=0)


def compile_plan(schedule: Schedule, rank: int, numel: int, piece_elems: int) -> Plan:
    """This rank's messages for a buffer of ``numel`` elements (see module doc)."""
    bounds = chunk_bounds(numel, schedule.num_chunks)
    steps = []
    scratch_max = 0
    for index, ((sends, recvs), step) in enumerate(zip(schedule.program(rank), schedule.steps)):
        send_x, recv_x = [], []
        send_ranges = [(bounds[o.lo], bounds[o.hi]) for o in sends]
        recv_ranges = [(bounds[o.lo], bounds[o.hi]) for o in recvs]
        for o in sends:
            for k, a, b in _pieces(bounds[o.lo], bounds[o.hi], piece_elems):
                send_x.append(Xfer(o.peer, a, b, k))
        scratch = 0
        after = []
        for j, o in enumerate(recvs):
            a0, a1 = recv_ranges[j]
            reduce = o.kind is OpKind.RECV_REDUCE
            clash = overlaps(a0, a1, send_ranges) or overlaps(
                a0, a1, recv_ranges[:j] + recv_ranges[j + 1 :]
            )
            via_scratch = reduce or clash
            for k, a, b in _pieces(a0, a1, piece_elems):
                recv_x.append(Xfer(o.peer, a, b, k, reduce, scratch if via_scratch else -1))
                # writing back into the buffer must not race a send of this step still
                # reading there; only the overlapping pieces are waited for, so piece k is
                # reduced while pieces k+1.. are still on the wire
                after.append(_last_overlap(a, b, send_x) if via_scratch else 0)
                if via_scratch:
                    scratch += b - a
        # sends are waited for in order: keep the counts non-decreasing
        for i in range(1, len(after)):
            after[i] = max(after[i], after[i - 1])
        scratch_max = max(scratch_max, scratch)
        if send_x or recv_x:
            steps.append(StepPlan(index, step.phase, tuple(send_x), tuple(recv_x), tuple(after)))
    sent = sum(x.stop - x.start for st in steps for x in st.sends)
    return Plan(tuple(steps), scratch_max, len(schedule.ranks), schedule.num_steps, sent)
