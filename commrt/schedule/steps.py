"""The parts a :class:`~commrt.schedule.Schedule` is made of.

What a schedule computes (:class:`Collective`), one point-to-point op
(:class:`OpKind`, :class:`Op`), the ops that run concurrently
(:class:`Step`), and lazy lists of steps (:class:`Steps`, :func:`parallel`)
over a buffer cut by :func:`chunk_bounds`. Plain data with no dependency on
the rest of the project, so that both :mod:`commrt.schedule` and its
symbolic checker (:mod:`commrt.schedule.check`) can build on it. Import
these names from :mod:`commrt.schedule`, which re-exports them.
"""

from __future__ import annotations

import enum
import functools
from collections import OrderedDict
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from commrt.errors import ScheduleError

__all__ = [
    "Collective",
    "OpKind",
    "Op",
    "SEND",
    "RECV_REDUCE",
    "RECV_COPY",
    "Step",
    "Steps",
    "chunk_bounds",
    "parallel",
]


class Collective(enum.Enum):
    """What a schedule computes."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"  # owners[c] ends with the full sum of chunk c
    ALL_GATHER = "all_gather"  # owners[c] starts with chunk c; everyone ends with it
    # owners[c] (the root) starts with chunk c; everyone ends with that rank's chunk, nobody
    # else's contribution mixed in
    BROADCAST = "broadcast"
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
SEND, RECV_REDUCE, RECV_COPY = 0, 1, 2  # kind codes in Step.kind


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
        for name, dt in (
            ("kind", np.int8),
            ("rank", np.int32),
            ("peer", np.int32),
            ("lo", np.int64),
            ("hi", np.int64),
        ):
            a = _frozen(getattr(self, name), dt)
            if a.shape != (n,):
                raise ScheduleError(f"Step.{name} must be 1-D of length {n}, got shape {a.shape}")
            object.__setattr__(self, name, a)

    @classmethod
    def of(cls, ops: Iterable[Op], phase: str = "") -> "Step":
        """A step from :class:`Op` objects."""
        ops = list(ops)
        return cls(
            np.array([_CODE[o.kind] for o in ops], dtype=np.int8),
            np.array([o.rank for o in ops], dtype=np.int32),
            np.array([o.peer for o in ops], dtype=np.int32),
            np.array([o.lo for o in ops], dtype=np.int64),
            np.array([o.hi for o in ops], dtype=np.int64),
            phase,
        )

    @classmethod
    def concat(cls, steps: Sequence["Step"], phase: str | None = None) -> "Step":
        """All ops of ``steps`` in one step (fragments running side by side)."""
        if phase is None:
            phase = "/".join(dict.fromkeys(st.phase for st in steps if st.phase))
        return cls(
            *(
                np.concatenate([getattr(st, f) for st in steps]) if steps else np.empty(0)
                for f in ("kind", "rank", "peer", "lo", "hi")
            ),
            phase,
        )

    def __len__(self) -> int:
        return len(self.kind)

    @functools.cached_property
    def ops(self) -> tuple[Op, ...]:
        return tuple(
            Op(_KINDS[k], int(r), int(p), int(a), int(b))
            for k, r, p, a, b in zip(
                self.kind.tolist(),
                self.rank.tolist(),
                self.peer.tolist(),
                self.lo.tolist(),
                self.hi.tolist(),
            )
        )

    def ops_of(self, rank: int) -> tuple[Op, ...]:
        """This rank's ops, in step order (cheap even for huge steps)."""
        idx = np.flatnonzero(self.rank == rank)
        return tuple(
            Op(_KINDS[int(self.kind[i])], rank, int(self.peer[i]), int(self.lo[i]), int(self.hi[i]))
            for i in idx
        )


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


def parallel(step_lists: Sequence[Sequence[Step]]) -> Steps:
    """Merge step lists that run side by side (on disjoint ranks) step by step.

    Step ``i`` of the result holds the ops of step ``i`` of every list; the
    longest list sets the length. Used to run all rows (or columns) of a
    torus at once.
    """
    lists = list(step_lists)
    n = max((len(s) for s in lists), default=0)
    return Steps(n, lambda i: Step.concat([s[i] for s in lists if i < len(s)]))
