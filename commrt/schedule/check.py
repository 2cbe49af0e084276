"""The symbolic checker: proves that a schedule computes its collective.

Each (rank, chunk) holds the set of ranks whose contribution it contains, as
a bit mask; :func:`check` replays the steps on those masks, one helper per
kind of problem. Import :func:`check` and :class:`CheckReport` from
:mod:`commrt.schedule` (or call ``Schedule.check()``); they live here so that
the schedule module stays small. This module must not import
:mod:`commrt.schedule`, which imports it: it reads a schedule through the
attributes :class:`Checkable` lists and builds on :mod:`commrt.schedule.steps`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol, Sequence

from commrt.errors import ScheduleError
from commrt.schedule.steps import Collective, Op, OpKind, Step

__all__ = ["CheckReport", "Checkable", "check"]

_GARBAGE = -1  # a chunk whose contents are undefined (all-gather inputs not yet arrived)

#: rank -> per chunk, the mask of ranks whose contribution it holds (or _GARBAGE)
State = dict[int, list[int]]


class Checkable(Protocol):
    """What the checker reads of a :class:`~commrt.schedule.Schedule`."""

    name: str
    collective: Collective
    world_size: int
    ranks: tuple[int, ...]
    num_chunks: int
    steps: Sequence[Step]
    owners: tuple[int, ...] | None
    sources: tuple[int, ...] | None

    @property
    def chunk_span(self) -> tuple[int, int]: ...


@dataclass(frozen=True)
class CheckReport:
    """Outcome of :func:`check`. ``errors`` lists problems, first one first."""

    schedule_name: str
    world_size: int
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_if_failed(self) -> None:
        if self.errors:
            raise ScheduleError(str(self))

    def __str__(self) -> str:
        if self.ok:
            return f"{self.schedule_name} (p={self.world_size}): ok"
        more = f" (+{len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        return f"{self.schedule_name} (p={self.world_size}): {self.errors[0]}{more}"


class _Errors:
    """Problems found so far. ``add`` answers whether the limit is reached, so a loop that
    reports many of one kind can stop; some reports do not stop (as they never did), so
    a report may end a few entries over the limit."""

    def __init__(self, limit: int):
        self.items: list[str] = []
        self.limit = limit

    def add(self, msg: str) -> bool:
        self.items.append(msg)
        return self.full

    @property
    def full(self) -> bool:
        return len(self.items) >= self.limit


def _ranks_text(mask: int) -> str:
    return "{" + ",".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1) + "}"


def _mask_of(ranks: Sequence[int]) -> int:
    mask = 0
    for r in ranks:
        mask |= 1 << r
    return mask


def _initial_state(s: Checkable, everyone: int) -> State:
    state: State = {}
    for r in s.ranks:
        if s.collective is Collective.ALL_GATHER:
            state[r] = [everyone if s.owners[c] == r else _GARBAGE for c in range(s.num_chunks)]
        elif s.collective is Collective.BROADCAST:
            # a non-root's buffer is overwritten, so its old contents count as undefined
            state[r] = [1 << r if s.owners[c] == r else _GARBAGE for c in range(s.num_chunks)]
        else:
            state[r] = [1 << r] * s.num_chunks
    return state


def _valid_ops(
    i: int, step: Step, part: set[int], span: tuple[int, int], errors: _Errors
) -> list[Op]:
    """The step's ops that name participants ``part``, a peer other than themselves and
    chunks inside ``span``; the others are reported."""
    lo_span, hi_span = span
    ok_ops = []
    for op in step.ops:
        if op.rank not in part or op.peer not in part:
            problem = f"step {i}: op {op} of rank {op.rank} names a rank outside {sorted(part)}"
        elif op.peer == op.rank:
            problem = f"step {i}: rank {op.rank} waits on itself ({op})"
        elif not (lo_span <= op.lo < op.hi <= hi_span):
            problem = (
                f"step {i}: rank {op.rank} op {op} touches chunks outside [{lo_span}, {hi_span})"
            )
        else:
            ok_ops.append(op)
            continue
        if errors.add(problem):
            break
    return ok_ops


def _report_unmatched(i: int, ops: list[Op], errors: _Errors) -> None:
    """Sends without a matching receive in the same step, and receives without a send."""
    sends: Counter = Counter()
    recvs: Counter = Counter()
    for op in ops:
        if op.kind is OpKind.SEND:
            sends[(op.rank, op.peer, op.lo, op.hi)] += 1
        else:
            recvs[(op.peer, op.rank, op.lo, op.hi)] += 1
    for src, dst, lo, hi in sorted((sends - recvs).keys()):
        if errors.add(
            f"step {i}: rank {src} sends chunks [{lo},{hi}) to rank {dst}, "
            f"which posts no matching receive"
        ):
            break
    for src, dst, lo, hi in sorted((recvs - sends).keys()):
        if errors.add(
            f"step {i}: rank {dst} receives chunks [{lo},{hi}) from rank {src}, "
            f"which sends no such chunks"
        ):
            break


def _capture_sends(i: int, ops: list[Op], state: State, errors: _Errors) -> dict:
    """What each send carries: sends read the buffer as it was before the step."""
    carried: dict[tuple[int, int, int, int], list[int]] = {}
    for op in ops:
        if op.kind is OpKind.SEND:
            vals = state[op.rank][op.lo : op.hi]
            for c, v in zip(op.chunks, vals):
                if v == _GARBAGE:
                    errors.add(
                        f"step {i}: rank {op.rank} sends chunk {c} to rank {op.peer} "
                        f"before it holds any data for it"
                    )
            carried[(op.rank, op.peer, op.lo, op.hi)] = vals
    return carried


def _report_racing_writes(i: int, ops: list[Op], errors: _Errors) -> None:
    """Two writes to one chunk in a step where one is a copy: arrival order would decide."""
    writes: Counter = Counter()
    copies: set = set()
    for op in ops:
        if op.kind.is_recv:
            for c in op.chunks:
                writes[(op.rank, c)] += 1
                if op.kind is OpKind.RECV_COPY:
                    copies.add((op.rank, c))
    for (r, c), n in sorted(writes.items()):
        if n > 1 and (r, c) in copies:
            errors.add(
                f"step {i}: rank {r}, chunk {c}: {n} writes in one step, one of them a "
                f"copy (the result would depend on arrival order)"
            )


def _apply_receives(i: int, ops: list[Op], carried: dict, state: State, errors: _Errors) -> None:
    """Copy or add what each receive gets; report reductions into undefined data and
    contributions counted twice."""
    for op in ops:
        if op.kind is OpKind.SEND:
            continue
        sent = carried.get((op.peer, op.rank, op.lo, op.hi))
        if sent is None:
            continue  # no matching send: reported by _report_unmatched, nothing arrives
        row = state[op.rank]
        for c, val in zip(op.chunks, sent):
            if val == _GARBAGE:
                continue  # already reported at the send
            cur = row[c]
            if op.kind is OpKind.RECV_COPY:
                row[c] = val
            elif cur == _GARBAGE:
                errors.add(f"step {i}: rank {op.rank}, chunk {c}: reduces into undefined data")
            elif cur & val:
                errors.add(
                    f"step {i}: rank {op.rank}, chunk {c}: adds contributions of ranks "
                    f"{_ranks_text(cur & val)} twice (from rank {op.peer})"
                )
            else:
                row[c] = cur | val


def _replay_step(
    i: int, step: Step, part: set[int], span: tuple[int, int], state: State, errors: _Errors
) -> None:
    ops = _valid_ops(i, step, part, span, errors)
    _report_unmatched(i, ops, errors)
    if errors.full:
        return
    carried = _capture_sends(i, ops, state, errors)
    _report_racing_writes(i, ops, errors)
    _apply_receives(i, ops, carried, state, errors)


def _wanted(
    s: Checkable, r: int, c: int, initial: State, everyone: int, source: dict[int, int]
) -> int | None:
    """The mask rank ``r`` must end with in chunk ``c``; None where anything goes."""
    lo_span, hi_span = s.chunk_span
    if not lo_span <= c < hi_span:
        return initial[r][c]  # untouched
    if s.collective is Collective.REDUCE_SCATTER and s.owners[c] != r:
        return None
    if s.collective is Collective.BROADCAST:
        return 1 << s.owners[c]
    if s.collective is Collective.GOSSIP:
        return 1 << r | 1 << source[r]
    return everyone


def _report_final_state(
    s: Checkable, state: State, initial: State, everyone: int, errors: _Errors
) -> None:
    """The first rank and chunk (rank order, then chunk order) that does not hold what the
    collective promises."""
    source = dict(zip(s.ranks, s.sources)) if s.collective is Collective.GOSSIP else {}
    for r in s.ranks:
        for c in range(s.num_chunks):
            want = _wanted(s, r, c, initial, everyone, source)
            v = state[r][c]
            if want is None or v == want:
                continue
            have = "undefined data" if v == _GARBAGE else f"contributions of ranks {_ranks_text(v)}"
            missing = "" if v == _GARBAGE else f" (missing {_ranks_text(want & ~v)})"
            if errors.add(
                f"rank {r}, chunk {c}: ends with {have}{missing}; "
                f"{s.collective.value} needs {_ranks_text(want)}"
            ):
                break
        if errors.full:
            break


def check(schedule: Checkable, max_errors: int = 20) -> CheckReport:
    """Prove symbolically that ``schedule`` computes its collective.

    Each (rank, chunk) holds the set of ranks whose contribution it
    contains, as a bit mask. The checker replays the steps and reports:

    * ops naming ranks outside the participants, a rank sending to itself,
      chunk ranges outside the span;
    * sends without a matching receive in the same step (and vice versa);
    * sends of undefined data, reductions that count a contribution twice,
      two writes to one chunk in a step when one of them is a copy;
    * at the end, the first rank and chunk (rank order, then chunk order)
      that does not hold what the collective promises (for gossip: its own
      contribution and exactly its ``sources`` rank's, no more, no fewer).
    """
    s = schedule
    errors = _Errors(max_errors)
    everyone = _mask_of(s.ranks)
    state = _initial_state(s, everyone)
    initial = {r: list(v) for r, v in state.items()}
    part = set(s.ranks)
    for i, step in enumerate(s.steps):
        _replay_step(i, step, part, s.chunk_span, state, errors)
        if errors.full:
            break
    if not errors.items:
        _report_final_state(s, state, initial, everyone, errors)
    return CheckReport(s.name, s.world_size, tuple(errors.items))
