"""Schedules: collectives written down as plain data.

A :class:`Schedule` is a sequence of :class:`Step` s; each step is a set of
point-to-point :class:`Op` s on a flat buffer cut into ``num_chunks`` equal
chunks. An op names one rank, one peer and a contiguous chunk range
``[lo, hi)``:

* ``SEND``: send those chunks to ``peer``;
* ``RECV_REDUCE``: receive those chunks from ``peer`` and add them in;
* ``RECV_COPY``: receive those chunks from ``peer`` and overwrite.

Within a step every send reads the buffer as it was *before* the step, so a
rank may send a chunk and receive into another (or the same) chunk in one
step. The same description runs on every transport (through
:mod:`commrt.executor`) and in the cost simulator, and :func:`check` proves
symbolically that it computes its collective.

Example::

    >>> from commrt.algorithms import Ring
    >>> s = Ring().schedule(4)
    >>> s.num_steps, s.check().ok
    (6, True)
    >>> print(s)                                        # doctest: +SKIP
    ring all_reduce · 4 ranks · 4 chunks · 6 steps
    step  phase           r0          r1          r2          r3
    0     reduce-scatter  c0→1 c3+←3  c1→2 c0+←0  ...
"""
from __future__ import annotations

import enum
import functools
from collections import Counter, OrderedDict
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from commrt.errors import ScheduleError

__all__ = ["Collective", "OpKind", "Op", "Step", "Steps", "Schedule", "CheckReport", "check",
           "chunk_bounds", "sequence", "parallel"]


class Collective(enum.Enum):
    """What a schedule computes."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"   # owners[c] ends with the full sum of chunk c
    ALL_GATHER = "all_gather"           # owners[c] starts with chunk c; everyone ends with it
    BROADCAST = "broadcast"             # owners[c] (the root) starts with chunk c; everyone ends with
                                        # that rank's chunk, nobody else's contribution mixed in
    # ranks[i] ends with its own contribution plus exactly that of sources[i] (if it names
    # itself: nothing added), in every chunk
    GOSSIP = "gossip"


class OpKind(enum.Enum):
    SEND = "send"
    RECV_REDUCE = "recv_reduce"
    RECV_COPY = "recv_copy"

    @property
    def is_recv(self) -> bool:
        return self is not OpKind.SEND


@dataclass(frozen=True)
class Op:
    """One point-to-point operation of one rank on chunks ``[lo, hi)``."""

    kind: OpKind
    rank: int
    peer: int
    lo: int
    hi: int

    @property
    def chunks(self) -> range:
        return range(self.lo, self.hi)

    def _chunk_text(self) -> str:
        return f"c{self.lo}" if self.hi == self.lo + 1 else f"c{self.lo}-{self.hi - 1}"

    def __str__(self) -> str:
        c = self._chunk_text()
        if self.kind is OpKind.SEND:
            return f"{c}→{self.peer}"
        return f"{c}{'+' if self.kind is OpKind.RECV_REDUCE else '='}←{self.peer}"


_KINDS = (OpKind.SEND, OpKind.RECV_REDUCE, OpKind.RECV_COPY)
_CODE = {k: i for i, k in enumerate(_KINDS)}
SEND, RECV_REDUCE, RECV_COPY = 0, 1, 2   # kind codes in Step.kind


def _frozen(a, dtype) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=dtype)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Step:
    """Ops that run concurrently; ``phase`` labels the step in tables and traces.

    Stored column-wise, one read-only array per field (``kind`` holds the
    codes SEND=0, RECV_REDUCE=1, RECV_COPY=2), so a step of a 4096-rank
    ring is five arrays rather than 8192 objects; the simulator works on the
    arrays directly. ``ops`` gives the same step as :class:`Op` objects.
    """

    kind: np.ndarray
    rank: np.ndarray
    peer: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    phase: str = ""

    def __post_init__(self):
        n = len(self.kind)
        for name, dt in (("kind", np.int8), ("rank", np.int32), ("peer", np.int32),
                         ("lo", np.int64), ("hi", np.int64)):
            a = _frozen(getattr(self, name), dt)
            if a.shape != (n,):
                raise ScheduleError(f"Step.{name} must be 1-D of length {n}, got shape {a.shape}")
            object.__setattr__(self, name, a)

    @classmethod
    def of(cls, ops: Iterable[Op], phase: str = "") -> "Step":
        """A step from :class:`Op` objects."""
        ops = list(ops)
        return cls(np.array([_CODE[o.kind] for o in ops], dtype=np.int8),
                   np.array([o.rank for o in ops], dtype=np.int32), np.array([o.peer for o in ops], dtype=np.int32),
                   np.array([o.lo for o in ops], dtype=np.int64), np.array([o.hi for o in ops], dtype=np.int64), phase)

    @classmethod
    def concat(cls, steps: Sequence["Step"], phase: str | None = None) -> "Step":
        """All ops of ``steps`` in one step (fragments running side by side)."""
        if phase is None:
            phase = "/".join(dict.fromkeys(st.phase for st in steps if st.phase))
        return cls(*(np.concatenate([getattr(st, f) for st in steps]) if steps else np.empty(0)
                     for f in ("kind", "rank", "peer", "lo", "hi")), phase)

    def __len__(self) -> int:
        return len(self.kind)

    @functools.cached_property
    def ops(self) -> tuple[Op, ...]:
        return tuple(Op(_KINDS[k], int(r), int(p), int(a), int(b))
                     for k, r, p, a, b in zip(self.kind.tolist(), self.rank.tolist(), self.peer.tolist(),
                                              self.lo.tolist(), self.hi.tolist()))

    def ops_of(self, rank: int) -> tuple[Op, ...]:
        """This rank's ops, in step order (cheap even for huge steps)."""
        idx = np.flatnonzero(self.rank == rank)
        return tuple(Op(_KINDS[int(self.kind[i])], rank, int(self.peer[i]), int(self.lo[i]), int(self.hi[i]))
                     for i in idx)


class Steps(SequenceABC):
    """A lazily built, read-only sequence of steps.

    Step ``i`` is made by ``make(i)`` when first asked for; a few recent
    ones are kept. A 4096-rank ring has 8190 steps of 8192 ops each: built
    eagerly that is tens of millions of entries, lazily it costs nothing
    until a consumer (executor, simulator) walks it.
    """

    def __init__(self, n: int, make: Callable[[int], Step], keep: int = 8):
        self._n, self._make, self._keep = int(n), make, keep
        self._recent: OrderedDict[int, Step] = OrderedDict()

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self._n)))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"step {i} of {self._n}")
        st = self._recent.get(i)
        if st is None:
            st = self._make(i)
            self._recent[i] = st
            if len(self._recent) > self._keep:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(i)
        return st

    def __iter__(self) -> Iterator[Step]:
        for i in range(self._n):
            yield self[i]

    @staticmethod
    def chain(parts: Sequence[Sequence[Step]]) -> "Steps":
        """The steps of ``parts`` one after another."""
        parts = [p for p in parts if len(p)]
        starts = np.cumsum([0] + [len(p) for p in parts])

        def make(i: int) -> Step:
            k = int(np.searchsorted(starts, i, side="right")) - 1
            return parts[k][i - int(starts[k])]
        return Steps(int(starts[-1]), make)


def chunk_bounds(numel: int, num_chunks: int) -> tuple[int, ...]:
    """Element offsets of the ``num_chunks + 1`` chunk boundaries of a buffer.

    Chunks differ in size by at most one element (the first ``numel %
    num_chunks`` are one longer), so any ``numel`` works, including
    ``numel < num_chunks`` (some chunks are then empty).
    """
    base, extra = divmod(numel, num_chunks)
    bounds = [0]
    for c in range(num_chunks):
        bounds.append(bounds[-1] + base + (1 if c < extra else 0))
    return tuple(bounds)


@dataclass(frozen=True)
class Schedule:
    """A collective as steps of point-to-point ops over ``num_chunks`` chunks.

    ``ranks`` are the participants: a schedule may cover only a subset of
    ``world_size`` (a torus row, the fastest N of N+b workers). ``owners``
    maps each chunk to the rank that ends with it (reduce-scatter) or starts
    with it (all-gather). ``span`` limits the collective to chunks
    ``[lo, hi)``; chunks outside it must not be touched. ``sources`` (gossip
    only) names, per participant, the one rank whose contribution it must
    add to its own.
    """

    name: str
    collective: Collective
    world_size: int
    ranks: tuple[int, ...]
    num_chunks: int
    steps: Sequence[Step]
    owners: tuple[int, ...] | None = None
    span: tuple[int, int] | None = None
    sources: tuple[int, ...] | None = None
    _programs: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        if isinstance(self.steps, list):
            object.__setattr__(self, "steps", tuple(self.steps))
        if self.world_size < 1:
            raise ScheduleError(f"world_size must be >= 1, got {self.world_size}")
        if not self.ranks or len(set(self.ranks)) != len(self.ranks):
            raise ScheduleError(f"ranks must be distinct and non-empty, got {self.ranks}")
        bad = [r for r in self.ranks if not 0 <= r < self.world_size]
        if bad:
            raise ScheduleError(f"ranks {bad} are outside world_size {self.world_size}")
        if self.num_chunks < 1:
            raise ScheduleError(f"num_chunks must be >= 1, got {self.num_chunks}")
        if self.collective not in (Collective.ALL_REDUCE, Collective.GOSSIP) and (
                self.owners is None or len(self.owners) != self.num_chunks):
            raise ScheduleError(f"a {self.collective.value} schedule needs one owner per chunk")
        if self.collective is Collective.GOSSIP and (
                self.sources is None or len(self.sources) != len(self.ranks)
                or not set(self.sources) <= set(self.ranks)):
            raise ScheduleError("a gossip schedule needs one source rank (a participant) per "
                                "participant")

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def chunk_span(self) -> tuple[int, int]:
        return self.span if self.span is not None else (0, self.num_chunks)

    def program(self, rank: int) -> tuple[tuple[tuple[Op, ...], tuple[Op, ...]], ...]:
        """This rank's view: per step, (its sends, its receives), in schedule order."""
        prog = self._programs.get(rank)
        if prog is None:
            out = []
            for st in self.steps:
                mine = st.ops_of(rank)
                out.append((tuple(o for o in mine if o.kind is OpKind.SEND),
                            tuple(o for o in mine if o.kind.is_recv)))
            prog = tuple(out)
            self._programs[rank] = prog
        return prog

    def messages(self) -> int:
        """Number of point-to-point messages (sends) in the whole schedule."""
        return sum(int(np.count_nonzero(st.kind == SEND)) for st in self.steps)

    def check(self) -> "CheckReport":
        """Symbolic proof that the schedule computes its collective (see :func:`check`)."""
        return check(self)

    def table(self, max_ranks: int = 8, max_steps: int = 40) -> str:
        """A readable table: one row per step, one column per rank."""
        shown = self.ranks[:max_ranks]
        head = (f"{self.name} {self.collective.value} · {len(self.ranks)} ranks · "
                f"{self.num_chunks} chunks · {self.num_steps} steps")
        rows = [["step", "phase"] + [f"r{r}" for r in shown]]
        for i, step in enumerate(self.steps[:max_steps]):
            cells = {r: [] for r in shown}
            for r in shown:
                cells[r] = [str(op) for op in step.ops_of(r)]
            rows.append([str(i), step.phase] + [" ".join(cells[r]) or "·" for r in shown])
        widths = [max(len(row[j]) for row in rows) for j in range(len(rows[0]))]
        lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        if len(self.ranks) > max_ranks:
            lines.append(f"… {len(self.ranks) - max_ranks} more ranks not shown")
        if self.num_steps > max_steps:
            lines.append(f"… {self.num_steps - max_steps} more steps not shown")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def sequence(name: str, collective: Collective, world_size: int, ranks: Sequence[int],
             num_chunks: int, parts: Sequence[Sequence[Step]], **kw) -> Schedule:
    """A schedule that runs the step lists ``parts`` one after another."""
    return Schedule(name, collective, world_size, tuple(ranks), num_chunks, Steps.chain(list(parts)), **kw)


def parallel(step_lists: Sequence[Sequence[Step]]) -> Steps:
    """Merge step lists that run side by side (on disjoint ranks) step by step.

    Step ``i`` of the result holds the ops of step ``i`` of every list; the
    longest list sets the length. Used to run all rows (or columns) of a
    torus at once.
    """
    lists = list(step_lists)
    n = max((len(s) for s in lists), default=0)
    return Steps(n, lambda i: Step.concat([s[i] for s in lists if i < len(s)]))


# --------------------------------------------------------------------------
# symbolic checker
# --------------------------------------------------------------------------

_GARBAGE = -1   # a chunk whose contents are undefined (all-gather inputs not yet arrived)


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


def _ranks_text(mask: int) -> str:
    return "{" + ",".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1) + "}"


def check(schedule: Schedule, max_errors: int = 20) -> CheckReport:
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
    errors: list[str] = []
    part = set(s.ranks)
    full = 0
    for r in s.ranks:
        full |= 1 << r
    lo_span, hi_span = s.chunk_span
    source = dict(zip(s.ranks, s.sources)) if s.collective is Collective.GOSSIP else {}
    state: dict[int, list[int]] = {}
    for r in s.ranks:
        if s.collective is Collective.ALL_GATHER:
            state[r] = [full if s.owners[c] == r else _GARBAGE for c in range(s.num_chunks)]
        elif s.collective is Collective.BROADCAST:
            # a non-root's buffer is overwritten, so its old contents count as undefined
            state[r] = [1 << r if s.owners[c] == r else _GARBAGE for c in range(s.num_chunks)]
        else:
            state[r] = [1 << r] * s.num_chunks
    initial = {r: list(v) for r, v in state.items()}

    def err(msg: str) -> bool:
        errors.append(msg)
        return len(errors) >= max_errors

    for i, step in enumerate(s.steps):
        sends: Counter = Counter()
        recvs: Counter = Counter()
        ok_ops = []
        for op in step.ops:
            if op.rank not in part or op.peer not in part:
                if err(f"step {i}: op {op} of rank {op.rank} names a rank outside {sorted(part)}"):
                    break
                continue
            if op.peer == op.rank:
                if err(f"step {i}: rank {op.rank} waits on itself ({op})"):
                    break
                continue
            if not (lo_span <= op.lo < op.hi <= hi_span):
                if err(f"step {i}: rank {op.rank} op {op} touches chunks outside [{lo_span}, {hi_span})"):
                    break
                continue
            ok_ops.append(op)
            if op.kind is OpKind.SEND:
                sends[(op.rank, op.peer, op.lo, op.hi)] += 1
            else:
                recvs[(op.peer, op.rank, op.lo, op.hi)] += 1
        for key in sorted((sends - recvs).keys()):
            src, dst, lo, hi = key
            if err(f"step {i}: rank {src} sends chunks [{lo},{hi}) to rank {dst}, "
                   f"which posts no matching receive"):
                break
        for key in sorted((recvs - sends).keys()):
            src, dst, lo, hi = key
            if err(f"step {i}: rank {dst} receives chunks [{lo},{hi}) from rank {src}, "
                   f"which sends no such chunks"):
                break
        if len(errors) >= max_errors:
            break
        # Sends read the buffer as it was before the step: capture what they carry.
        carried: dict[tuple[int, int, int, int], list[int]] = {}
        for op in ok_ops:
            if op.kind is OpKind.SEND:
                vals = state[op.rank][op.lo:op.hi]
                for c, v in zip(op.chunks, vals):
                    if v == _GARBAGE:
                        err(f"step {i}: rank {op.rank} sends chunk {c} to rank {op.peer} "
                            f"before it holds any data for it")
                carried[(op.rank, op.peer, op.lo, op.hi)] = vals
        writes: Counter = Counter()
        copies: set = set()
        for op in ok_ops:
            if op.kind.is_recv:
                for c in op.chunks:
                    writes[(op.rank, c)] += 1
                    if op.kind is OpKind.RECV_COPY:
                        copies.add((op.rank, c))
        for (r, c), n in sorted(writes.items()):
            if n > 1 and (r, c) in copies:
                err(f"step {i}: rank {r}, chunk {c}: {n} writes in one step, one of them a copy "
                    f"(the result would depend on arrival order)")
        for op in ok_ops:
            if op.kind is OpKind.SEND:
                continue
            row = state[op.rank]
            for c, val in zip(op.chunks, carried[(op.peer, op.rank, op.lo, op.hi)]):
                if val == _GARBAGE:
                    continue   # already reported at the send
                cur = row[c]
                if op.kind is OpKind.RECV_COPY:
                    row[c] = val
                elif cur == _GARBAGE:
                    err(f"step {i}: rank {op.rank}, chunk {c}: reduces into undefined data")
                elif cur & val:
                    err(f"step {i}: rank {op.rank}, chunk {c}: adds contributions of ranks "
                        f"{_ranks_text(cur & val)} twice (from rank {op.peer})")
                else:
                    row[c] = cur | val
        if len(errors) >= max_errors:
            break

    if not errors:
        for r in s.ranks:
            for c in range(s.num_chunks):
                v = state[r][c]
                inside = lo_span <= c < hi_span
                if not inside:
                    want = initial[r][c]   # untouched
                elif s.collective is Collective.REDUCE_SCATTER and s.owners[c] != r:
                    continue
                elif s.collective is Collective.BROADCAST:
                    want = 1 << s.owners[c]
                elif s.collective is Collective.GOSSIP:
                    want = 1 << r | 1 << source[r]
                else:
                    want = full
                if v != want:
                    have = "undefined data" if v == _GARBAGE else f"contributions of ranks {_ranks_text(v)}"
                    missing = "" if v == _GARBAGE else f" (missing {_ranks_text(want & ~v)})"
                    if err(f"rank {r}, chunk {c}: ends with {have}{missing}; "
                           f"{s.collective.value} needs {_ranks_text(want)}"):
                        break
            if len(errors) >= max_errors:
                break
    return CheckReport(s.name, s.world_size, tuple(errors))
