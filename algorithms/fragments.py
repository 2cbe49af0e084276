"""Reusable pieces that bigger schedules are composed of.

A fragment is a list of :class:`~commrt.schedule.Step` s over a subset of
ranks and a list of *blocks* (contiguous chunk ranges, one per rank). A ring
all-reduce is ``ring_reduce_scatter`` then ``ring_all_gather`` over all
ranks; a 2D torus runs the same fragments over rows and columns.
"""
from __future__ import annotations

from typing import Sequence

from commrt.schedule import Op, OpKind, Step

Block = tuple[int, int]   # chunk range [lo, hi)


def _check_blocks(ranks: Sequence[int], blocks: Sequence[Block]) -> None:
    if len(ranks) != len(blocks):
        raise ValueError(f"a ring over {len(ranks)} ranks needs {len(ranks)} blocks, got {len(blocks)}")


def ring_reduce_scatter(ranks: Sequence[int], blocks: Sequence[Block],
                        phase: str = "reduce-scatter") -> tuple[tuple[Step, ...], dict[int, int]]:
    """Ring reduce-scatter of ``blocks`` over ``ranks`` (len(ranks) - 1 steps).

    In step ``s`` the rank at ring position ``i`` sends block ``i - s`` to
    its successor and adds block ``i - s - 1`` arriving from its
    predecessor. Returns the steps and ``holder``: block index -> rank that
    ends with its full sum (position ``i`` ends with block ``i + 1``).
    """
    _check_blocks(ranks, blocks)
    m = len(ranks)
    steps = []
    for s in range(m - 1):
        ops = []
        for i, r in enumerate(ranks):
            ops.append(Op(OpKind.SEND, r, ranks[(i + 1) % m], *blocks[(i - s) % m]))
            ops.append(Op(OpKind.RECV_REDUCE, r, ranks[(i - 1) % m], *blocks[(i - s - 1) % m]))
        steps.append(Step(tuple(ops), phase))
    holder = {(i + 1) % m: r for i, r in enumerate(ranks)}
    return tuple(steps), holder


def ring_all_gather(ranks: Sequence[int], blocks: Sequence[Block],
                    phase: str = "all-gather") -> tuple[Step, ...]:
    """Ring all-gather; position ``i`` starts with block ``i + 1``.

    That is where :func:`ring_reduce_scatter` leaves the sums, so the two
    compose into an all-reduce without any reshuffling.
    """
    _check_blocks(ranks, blocks)
    m = len(ranks)
    steps = []
    for s in range(m - 1):
        ops = []
        for i, r in enumerate(ranks):
            ops.append(Op(OpKind.SEND, r, ranks[(i + 1) % m], *blocks[(i + 1 - s) % m]))
            ops.append(Op(OpKind.RECV_COPY, r, ranks[(i - 1) % m], *blocks[(i - s) % m]))
        steps.append(Step(tuple(ops), phase))
    return tuple(steps)


def split_block(block: Block, parts: int) -> list[Block]:
    """Cut a chunk range into ``parts`` equal sub-ranges (its length must divide)."""
    lo, hi = block
    n = hi - lo
    if n % parts:
        raise ValueError(f"block {block} of {n} chunks does not split into {parts} parts")
    w = n // parts
    return [(lo + k * w, lo + (k + 1) * w) for k in range(parts)]
