"""2D-torus all-reduce (Mikami et al., "Massively Distributed SGD", 2018).

The p participants form a grid of ``rows`` × ``cols`` ranks, numbered row
by row: participant ``i`` sits in row ``i // cols``, column ``i % cols``,
so each *row* is a run of ``cols`` consecutive ranks. The all-reduce runs in
three phases, all made of ring fragments over rank subsets (no new
communicators):

1. **row reduce-scatter**: every row runs a ring reduce-scatter; each rank
   ends with the row's sum of one 1/cols shard of the buffer;
2. **column all-reduce** of that shard: the ranks in one column all hold the
   same shard, so each column runs a ring all-reduce on it ("column
   reduce-scatter" then "column all-gather");
3. **row all-gather**: every row gathers the now global shards back.

With X = cols and Y = rows that is 2(X−1) + 2(Y−1) latency steps instead
of the ring's 2(p−1) (4 against 6 at p = 4; 28 against 126 at p = 64),
while every rank still sends the ring's 2(p−1)/p · n bytes: most of them,
2(X−1)/X · n, along rows, and only 2(Y−1)/p · n along columns.

**Default shape** (``Torus2D()`` with neither ``rows`` nor ``cols``): when
the launcher says how many ranks share a node (``comm.local_size``, which the
layer above agrees across ranks: :class:`commrt.tuning.hook_comm.HookComm`) and that number L divides p
with 1 < L < p, the grid is (p/L) × L: one row per
node, so the heavy row traffic stays inside a node and only the 1/L-sized
shards cross the network, as in the paper. Otherwise (no launcher
information, one rank per node, every rank on one node, or L not dividing
p) the grid is the most square factorisation, ``rows`` = the largest
divisor of p that is at most √p and ``cols`` = p / rows (so rows ≤ cols),
which minimises the number of steps. Giving one of ``rows``/``cols``
fixes the other as p divided by it.

**Prime p** (or any 1 × p / p × 1 grid): there is only one row (or one
column), the other phases are empty and the torus *is* the ring: the same
2(p−1) steps and the same messages as :class:`~commrt.algorithms.Ring`.

Example::

    >>> from commrt.algorithms import Torus2D
    >>> s = Torus2D(rows=2, cols=3).schedule(6)
    >>> s.num_steps, s.check().ok              # 2(3-1) + 2(2-1), ring: 10
    (6, True)
    >>> Torus2D().shape(12), Torus2D().shape(12, local_size=4), Torus2D().shape(7)
    ((3, 4), (3, 4), (1, 7))
    >>> print(Torus2D().describe(4))                   # doctest: +SKIP
    torus2d 2×2 grid: rows [0 1] [2 3] · columns [0 2] [1 3]
    torus2d all_reduce · 4 ranks · 4 chunks · 4 steps
    step  phase                  r0          r1          r2          r3
    0     row reduce-scatter     c0-1→1 ...
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.algorithms.fragments import (
    direct_all_gather,
    direct_reduce_scatter,
    ring_all_gather,
    ring_reduce_scatter,
    split_block,
)
from commrt.errors import named_keywords
from commrt.schedule import Collective, Schedule, Steps, parallel

__all__ = ["Torus2D", "square_shape", "grid_phases", "nodes_of"]

PHASES = ("row reduce-scatter", "column reduce-scatter", "column all-gather", "row all-gather")


def square_shape(p: int) -> tuple[int, int]:
    """The most square grid for ``p`` ranks: ``(rows, cols)`` with rows ≤ cols.

    ``rows`` is the largest divisor of ``p`` not above √p; a prime gives
    ``(1, p)``.
    """
    for r in range(math.isqrt(p), 0, -1):
        if p % r == 0:
            return r, p // r
    return 1, p  # p == 0 never reaches here; participants() rejects it


def grid_phases(
    ranks: Sequence[int], rows: int, cols: int, offset: int = 0, direct: bool = False
) -> tuple[tuple[Steps, Steps, Steps, Steps], dict[int, int]]:
    """The four phases of a ``rows`` × ``cols`` torus over ``ranks`` on chunks
    ``[offset, offset + p)`` (the :data:`PHASES`, in order), and ``owners``: chunk -> the
    rank that ends the reduce-scatter half with its full sum.

    :class:`Torus2D` runs them one after another; the pipelined torus
    (:mod:`commrt.algorithms.pipelined_torus`) runs one set per segment of
    the buffer, each a step behind the last. ``direct``: each column's
    reduce-scatter and all-gather take one step each
    (:func:`~commrt.algorithms.fragments.direct_reduce_scatter`), not Y − 1.
    """
    Y, X = rows, cols
    grid = [ranks[y * X : (y + 1) * X] for y in range(Y)]  # grid[y][x]
    columns = [tuple(grid[y][x] for y in range(Y)) for x in range(X)]
    # Chunk layout: X row blocks of Y chunks; block k = chunks offset + [kY, (k+1)Y).
    row_blocks = [(offset + k * Y, offset + (k + 1) * Y) for k in range(X)]
    # After the row reduce-scatter, column x holds row block (x + 1) % X
    # (ring_reduce_scatter leaves position i with block i + 1), in every row.
    col_blocks = [split_block(row_blocks[(x + 1) % X], Y) for x in range(X)]
    rs, ag = (
        (direct_reduce_scatter, direct_all_gather)
        if direct
        else (ring_reduce_scatter, ring_all_gather)
    )
    col_rs = [rs(c, b, PHASES[1]) for c, b in zip(columns, col_blocks)]
    phases = (
        parallel([ring_reduce_scatter(row, row_blocks, PHASES[0])[0] for row in grid]),
        parallel([steps for steps, _ in col_rs]),
        parallel([ag(c, b, PHASES[2]) for c, b in zip(columns, col_blocks)]),
        parallel([ring_all_gather(row, row_blocks, PHASES[3]) for row in grid]),
    )
    owners = {}
    for (_, holder), blocks in zip(col_rs, col_blocks):
        for k, (lo, _hi) in enumerate(blocks):
            owners[lo] = holder[k]
    return phases, owners


def nodes_of(comm) -> int | None:
    """Ranks per node as ``comm`` says it (its ``local_size``, which the hooks' ``comm``
    declares: see :class:`~commrt.algorithms.base.Algorithm`), None without a ``comm``.

    The number is taken as given: the layers above hand down a
    :class:`commrt.tuning.hook_comm.HookComm`, whose ``local_size`` every rank agreed on
    (:func:`commrt.tuning.topology.ranks_per_node`), so that all ranks pick the same grid.
    """
    return None if comm is None else comm.local_size


def _factorizations(p: int) -> str:
    return ", ".join(f"{r}×{p // r}" for r in range(1, p + 1) if p % r == 0)


def _check_dim(name: str, v) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"Torus2D {name} must be a positive integer or None, got {v!r}")


@named_keywords
@dataclass(frozen=True)
class Torus2D(Algorithm):
    """2D-torus all-reduce on a ``rows`` × ``cols`` grid (see the module doc).

    ``rows`` is the number of rows (Y), ``cols`` the number of ranks per row
    (X); the row phases run first and carry most of the bytes. Leave both
    None to let :meth:`select` choose per world size (one row per node when
    the launcher says so, else the most square grid), or give one and the
    other follows. A shape that does not multiply to the number of ranks
    raises ValueError when the schedule is built, on every rank, before any
    message.

    Example::

        >>> from commrt.algorithms import Torus2D, Ring
        >>> Torus2D(2, 2).schedule(4).num_steps, Ring().schedule(4).num_steps
        (4, 6)
    """

    rows: int | None = None
    cols: int | None = None

    name = "torus2d"

    def __post_init__(self):
        _check_dim("rows", self.rows)
        _check_dim("cols", self.cols)

    def supports(self, collective: Collective) -> bool:
        return True

    # ------------------------------------------------------------------ shape
    def shape(self, p: int, local_size: int | None = None) -> tuple[int, int]:
        """``(rows, cols)`` for ``p`` ranks; ``local_size`` = ranks per node, if known.

        Raises ValueError, naming p, the shape and the possible shapes, when
        the given dimensions do not fit ``p``.
        """
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"Torus2D needs a positive number of ranks, got {p!r}")
        rows, cols = self.rows, self.cols
        if rows is not None and cols is not None:
            if rows * cols != p:
                raise ValueError(
                    f"Torus2D grid {rows}×{cols} has {rows * cols} ranks but p={p} ranks take part "
                    f"(rows={rows}, cols={cols}); rows × cols must equal p, e.g. "
                    f"{_factorizations(p)}, or leave rows/cols as None to choose automatically"
                )
            return rows, cols
        if rows is not None or cols is not None:
            given, gname, other = (
                (rows, "rows", "cols") if rows is not None else (cols, "cols", "rows")
            )
            if p % given:
                raise ValueError(
                    f"Torus2D {gname}={given} does not divide p={p} ranks, so no {other} fits; "
                    f"possible grids for p={p}: {_factorizations(p)}"
                )
            return (given, p // given) if rows is not None else (p // given, given)
        if local_size is not None and 1 < local_size < p and p % local_size == 0:
            return p // local_size, local_size
        return square_shape(p)

    # --------------------------------------------------------------- schedule
    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.ALL_REDUCE,
    ) -> Schedule:
        """The torus schedule over ``ranks`` (default: all of ``world_size``), row by row.

        Steps are lazy: ``Torus2D(64, 64).schedule(4096)`` costs nothing
        until a consumer walks it, and each step is built with a few numpy
        operations per row or column.
        """
        ranks = participants(world_size, ranks)
        p = len(ranks)
        phases, owner_of = grid_phases(ranks, *self.shape(p))
        if collective is Collective.ALL_GATHER:
            parts = phases[2:]
        elif collective is Collective.REDUCE_SCATTER:
            parts = phases[:2]
        else:
            parts = phases
        owners = None
        if collective is not Collective.ALL_REDUCE:
            owners = tuple(owner_of[c] for c in range(p))
        return Schedule(
            self.name, collective, world_size, ranks, p, Steps.chain(parts), owners=owners
        )

    def select(self, world_size: int, nbytes: int, comm=None) -> Schedule:
        """The schedule for ``world_size`` ranks, one row per node if ``comm`` knows the nodes.

        ``comm`` is asked for ``local_size`` (:func:`nodes_of`); a
        :class:`commrt.tuning.hook_comm.HookComm` answers as every rank agreed (collective,
        on the first ask).
        """
        rows, cols = self.shape(world_size, nodes_of(comm))
        if (rows, cols) == (self.rows, self.cols):
            return self.schedule(world_size)
        return Torus2D(rows, cols).schedule(world_size)  # cached per shape

    # ---------------------------------------------------------------- display
    def describe(self, world_size: int, local_size: int | None = None) -> str:
        """The grid (which ranks form rows and columns) followed by the schedule table."""
        rows, cols = self.shape(world_size, local_size)
        grid = [list(range(y * cols, (y + 1) * cols)) for y in range(rows)]

        def groups(gs):
            return " ".join("[" + " ".join(map(str, g)) + "]" for g in gs[:8]) + (
                " …" if len(gs) > 8 else ""
            )

        head = (
            f"{self.name} {rows}×{cols} grid: rows {groups(grid)} · "
            f"columns {groups([[grid[y][x] for y in range(rows)] for x in range(cols)])}"
        )
        return head + "\n" + Torus2D(rows, cols).schedule(world_size).table()

    def __str__(self) -> str:
        if self.rows is None and self.cols is None:
            return self.name
        return f"{self.name}({self.rows if self.rows is not None else '?'}×{self.cols if self.cols is not None else '?'})"
