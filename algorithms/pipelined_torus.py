"""The 2D torus, pipelined: the buffer in segments, each a step behind the last.

:class:`~commrt.algorithms.Torus2D` runs its four phases one after another
(row reduce-scatter, column reduce-scatter, column all-gather, row
all-gather). With one row per node the rows are the fast tier (inside a
node) and the columns the slow one (between nodes), so while the rows work
the network is idle, and while the columns work the fast tier is idle.
Where the fast tier is only a few times faster than a rank's share of the
NIC (ranks sharing cores, with loopback as the fast tier), the row phases
are a good part of the torus's time.

:class:`PipelinedTorus2D` cuts the buffer into ``segments`` equal segments
and gives each the whole torus, on its own chunks; segment ``s`` starts one
step after segment ``s − 1``. Step ``t`` of the schedule holds step
``t − s`` of every segment ``s`` still running, so segment ``k``'s row
reduce-scatter travels inside a node while segments ``< k`` are on the
network, and the last segments' row all-gather while the others finish
their columns. The executor posts all of a step's sends and receives at once
(one group), so that overlap is real concurrency, not a reordering. The
column steps of several segments in flight share the rank's port, so the
network carries the same bytes as the torus's in about the same time, and
the rows hide under it except for one segment's row reduce-scatter at the
start and one segment's row all-gather at the end.

**Ring columns by default.** A column can instead reduce-scatter in one
step (each rank sends every other its block at once,
:func:`~commrt.algorithms.fragments.direct_reduce_scatter`) and all-gather
in one (``direct=True``): the same bytes in fewer steps. It is not the
default because every other rank's block at once on one port costs more
than the steps it saves: with ring columns the pipelined torus ran faster
at every size and segment count compared (docs/benchmarks.md).

Cost: one segment takes D = 2(X−1) + 2(Y−1) steps (ring columns) or
2(X−1) + 2 (direct), the pipeline D + S − 1, with the ring's bytes. On one link class
nothing overlaps (a rank's port carries its row and column bytes alike),
so the closed form is the ring's bytes plus one α per step; the simulator
prices two tiers by replaying the real schedule, where a rank's intra-node
and inter-node ports are separate. ``auto`` prices ring-column variants
only: the model's one α per step would favour direct columns (fewer
steps), and it does not price the contention on one port that makes them
slower.

Within a step the column ops come first: the executor posts them first, so
the slow link starts at once.

Example::

    >>> from commrt.algorithms import PipelinedTorus2D, Torus2D
    >>> s = PipelinedTorus2D(4, 2, segments=8).schedule(8)   # ring columns: D = 8
    >>> s.num_steps, Torus2D(4, 2).schedule(8).num_steps, s.check().ok
    (15, 8, True)
    >>> PipelinedTorus2D(4, 2, segments=8, direct=True).schedule(8).num_steps
    11
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.algorithms.torus import PHASES, Torus2D, grid_phases, nodes_of
from commrt.errors import named_keywords
from commrt.schedule import Collective, Schedule, Step, Steps

__all__ = ["PipelinedTorus2D", "segments_for", "MAX_SEGMENTS"]

#: the most segments :func:`segments_for` picks: past it each step's fixed cost (a wake-up of
#: every rank, costly where ranks share cores) outweighs the shorter ramp
MAX_SEGMENTS = 16
#: bytes per segment :func:`segments_for` aims at: smaller segments add steps whose fixed
#: cost outweighs the overlap they buy (docs/benchmarks.md)
SEGMENT_BYTES = 1 << 20


def segments_for(nbytes: int) -> int:
    """Segments for a buffer of ``nbytes`` when none are given: one per MiB, 1 to 16."""
    return max(1, min(MAX_SEGMENTS, int(nbytes) // SEGMENT_BYTES))


def _check_segments(v) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"PipelinedTorus2D segments must be a positive integer or None, got {v!r}")


def _is_row(phase: str) -> bool:
    return phase in (PHASES[0], PHASES[3])


def pipeline(segments: Sequence[Sequence[Step]], phase_of) -> Steps:
    """Step lists of equal length D, list ``s`` delayed by ``s`` steps: D + S − 1 steps.

    Step ``t`` concatenates step ``t − s`` of every list that has one, the
    ops of slow phases first (``phase_of(i)`` names the phase of step ``i``
    of a list; row phases go last).
    """
    segs = list(segments)
    depth = len(segs[0]) if segs else 0

    def make(t: int) -> Step:
        live = range(max(0, t - depth + 1), min(len(segs), t + 1))
        order = sorted(live, key=lambda s: _is_row(phase_of(t - s)))
        return Step.concat([segs[s][t - s] for s in order])

    return Steps(depth + len(segs) - 1 if depth else 0, make)


@named_keywords
@dataclass(frozen=True)
class PipelinedTorus2D(Algorithm):
    """The 2D torus on ``segments`` staggered segments of the buffer (see the module doc).

    ``rows``/``cols`` as in :class:`~commrt.algorithms.Torus2D` (None: one
    row per node when the communicator knows the nodes, else the most square
    grid). ``segments`` None: :func:`segments_for` the buffer's size in
    :meth:`select` (one per MiB, up to 16), and :attr:`DEFAULT_SEGMENTS`
    in :meth:`schedule`, which has no size. ``direct`` True: each column
    reduce-scatters and all-gathers in one step; None or False: around a
    ring (the default: the faster one, module doc). One segment
    with ring columns is the plain torus.
    """

    rows: int | None = None
    cols: int | None = None
    segments: int | None = None
    direct: bool | None = None

    name = "torus2d_pipelined"
    DEFAULT_SEGMENTS = 8

    def __post_init__(self):
        Torus2D(self.rows, self.cols)  # the same checks of rows and cols
        _check_segments(self.segments)
        if self.direct is not None and not isinstance(self.direct, bool):
            raise ValueError(
                f"PipelinedTorus2D direct must be True, False or None, got {self.direct!r}"
            )

    def shape(self, p: int, local_size: int | None = None) -> tuple[int, int]:
        """``(rows, cols)`` for ``p`` ranks, as :meth:`Torus2D.shape` chooses it."""
        return Torus2D(self.rows, self.cols).shape(p, local_size)

    def depth(self, rows: int, cols: int) -> int:
        """Steps of one segment: 2(X − 1) row steps, and 2 column steps (direct) or 2(Y − 1)."""
        column = (2 if rows > 1 else 0) if self.direct else 2 * (rows - 1)
        return 2 * (cols - 1) + column

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        """The pipelined all-reduce over ``ranks``: ``segments`` × p chunks, segment ``s``
        on chunks ``[s·p, (s+1)·p)``."""
        if collective is not Collective.ALL_REDUCE:
            raise ValueError(f"{self.name} runs all_reduce only, not {collective.value}")
        ranks = participants(world_size, ranks)
        p = len(ranks)
        rows, cols = self.shape(p)
        nseg = self.segments or self.DEFAULT_SEGMENTS
        direct = bool(self.direct)
        segs = [Steps.chain(grid_phases(ranks, rows, cols, s * p, direct)[0]) for s in range(nseg)]
        # one segment's steps: X-1 row steps, its column steps, X-1 row steps
        row_end, col_end = cols - 1, self.depth(rows, cols) - (cols - 1)

        def phase_of(i: int) -> str:
            return PHASES[0] if i < row_end else PHASES[1] if i < col_end else PHASES[3]

        return Schedule(
            self.name, collective, world_size, ranks, nseg * p, pipeline(segs, phase_of)
        )

    def supports(self, collective: Collective) -> bool:
        return collective is Collective.ALL_REDUCE

    def select(self, world_size: int, nbytes: int, comm=None) -> Schedule:
        """The schedule for a buffer of ``nbytes``: one row per node if ``comm`` knows the
        nodes, :func:`segments_for` ``nbytes`` unless ``segments`` was given."""
        rows, cols = self.shape(world_size, nodes_of(comm))
        seg = self.segments or segments_for(nbytes)
        # an equal instance hits schedule()'s cache
        return PipelinedTorus2D(rows, cols, seg, self.direct).schedule(world_size)

    def __str__(self) -> str:
        if (self.rows, self.cols, self.segments, self.direct) == (None, None, None, None):
            return self.name
        dims = [
            f"{'?' if self.rows is None else self.rows}x{'?' if self.cols is None else self.cols}"
        ]
        if self.segments is not None:
            dims.append(f"s{self.segments}")
        if self.direct is not None:
            dims.append("direct" if self.direct else "ring")
        return f"{self.name}({','.join(dims)})"
