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
:mod:`commrt.schedule.executor`) and in the cost simulator, and :func:`check` proves
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

The parts (:class:`Collective`, :class:`Op`, :class:`Step`, ...) live in
:mod:`commrt.schedule.steps` and the checker in :mod:`commrt.schedule.check`;
import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from commrt.errors import ScheduleError

# Re-exported: the algorithms, the executor, the simulator and the tests import these from here.
from commrt.schedule.check import CheckReport, check
from commrt.schedule.steps import (
    RECV_COPY,
    RECV_REDUCE,
    SEND,
    Collective,
    Op,
    OpKind,
    Step,
    Steps,
    chunk_bounds,
    parallel,
)

__all__ = [
    "Collective",
    "OpKind",
    "Op",
    "SEND",
    "RECV_REDUCE",
    "RECV_COPY",
    "Step",
    "Steps",
    "Schedule",
    "CheckReport",
    "check",
    "chunk_bounds",
    "sequence",
    "parallel",
]


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
            self.owners is None or len(self.owners) != self.num_chunks
        ):
            raise ScheduleError(f"a {self.collective.value} schedule needs one owner per chunk")
        if self.collective is Collective.GOSSIP and (
            self.sources is None
            or len(self.sources) != len(self.ranks)
            or not set(self.sources) <= set(self.ranks)
        ):
            raise ScheduleError(
                "a gossip schedule needs one source rank (a participant) per participant"
            )

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
                out.append(
                    (
                        tuple(o for o in mine if o.kind is OpKind.SEND),
                        tuple(o for o in mine if o.kind.is_recv),
                    )
                )
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
        # "gossip gossip" would say one name twice: the collective only when it adds something
        what = " ".join(dict.fromkeys([self.name, self.collective.value]))
        head = (
            f"{what} · {len(self.ranks)} ranks · {self.num_chunks} chunks · {self.num_steps} steps"
        )
        rows = [["step", "phase"] + [f"r{r}" for r in shown]]
        for i, step in enumerate(self.steps[:max_steps]):
            cells = {r: [] for r in shown}
            for r in shown:
                cells[r] = [str(op) for op in step.ops_of(r)]
            rows.append([str(i), step.phase] + [" ".join(cells[r]) or "·" for r in shown])
        widths = [max(len(row[j]) for row in rows) for j in range(len(rows[0]))]
        lines = [head] + [
            "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows
        ]
        if len(self.ranks) > max_ranks:
            lines.append(f"… {len(self.ranks) - max_ranks} more ranks not shown")
        if self.num_steps > max_steps:
            lines.append(f"… {self.num_steps - max_steps} more steps not shown")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def sequence(
    name: str,
    collective: Collective,
    world_size: int,
    ranks: Sequence[int],
    num_chunks: int,
    parts: Sequence[Sequence[Step]],
    **kw,
) -> Schedule:
    """A schedule that runs the step lists ``parts`` one after another."""
    return Schedule(
        name, collective, world_size, tuple(ranks), num_chunks, Steps.chain(list(parts)), **kw
    )
