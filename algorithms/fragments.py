"""Reusable pieces that bigger schedules are composed of.

A fragment is a lazy list of :class:`~commrt.schedule.Step` s over a subset
of ranks and a list of *blocks* (contiguous chunk ranges, one per rank). A
ring all-reduce is ``ring_reduce_scatter`` then ``ring_all_gather`` over
all ranks; a 2D torus runs the same fragments over rows and columns;
halving-doubling and recursive doubling share the fold-in/fold-out that
lets a power-of-two core serve any number of ranks.
Steps are built with numpy, one array op per field, so a 4096-rank ring
costs microseconds per step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from commrt.schedule import RECV_COPY, RECV_REDUCE, SEND, Op, OpKind, Step, Steps

Block = tuple[int, int]  # chunk range [lo, hi)


def _arrays(ranks: Sequence[int], blocks: Sequence[Block]):
    if len(ranks) != len(blocks):
        raise ValueError(
            f"a ring over {len(ranks)} ranks needs {len(ranks)} blocks, got {len(blocks)}"
        )
    r = np.asarray(ranks, dtype=np.int32)
    b = np.asarray(blocks, dtype=np.int64).reshape(len(blocks), 2)
    return r, b[:, 0], b[:, 1], np.arange(len(r))


def _pair_ops(rank, to, frm, send_block, recv_block, lo, hi, recv_kind: int, phase: str) -> Step:
    """Rank ``rank[k]`` sends block ``send_block[k]`` to ``to[k]`` and receives block
    ``recv_block[k]`` from ``frm[k]``, for every k: one send and one receive each."""
    n = 2 * len(rank)
    kind = np.empty(n, np.int8)
    kind[0::2], kind[1::2] = SEND, recv_kind
    peer = np.empty(n, np.int32)
    peer[0::2], peer[1::2] = to, frm
    a, b = np.empty(n, np.int64), np.empty(n, np.int64)
    a[0::2], b[0::2] = lo[send_block], hi[send_block]
    a[1::2], b[1::2] = lo[recv_block], hi[recv_block]
    return Step(kind, np.repeat(rank, 2), peer, a, b, phase)


def _ring_step(r, lo, hi, pos, send_block, recv_block, recv_kind: int, phase: str) -> Step:
    m = len(r)
    return _pair_ops(
        r, r[(pos + 1) % m], r[(pos - 1) % m], send_block, recv_block, lo, hi, recv_kind, phase
    )


def ring_reduce_scatter(
    ranks: Sequence[int], blocks: Sequence[Block], phase: str = "reduce-scatter"
) -> tuple[Steps, dict[int, int]]:
    """Ring reduce-scatter of ``blocks`` over ``ranks`` (len(ranks) - 1 steps).

    In step ``s`` the rank at ring position ``i`` sends block ``i - s`` to
    its successor and adds block ``i - s - 1`` arriving from its
    predecessor. Returns the steps and ``holder``: block index -> rank that
    ends with its full sum (position ``i`` ends with block ``i + 1``).
    """
    r, lo, hi, pos = _arrays(ranks, blocks)
    m = len(r)
    steps = Steps(
        m - 1,
        lambda s: _ring_step(r, lo, hi, pos, (pos - s) % m, (pos - s - 1) % m, RECV_REDUCE, phase),
    )
    holder = {(i + 1) % m: int(rank) for i, rank in enumerate(ranks)}
    return steps, holder


def ring_all_gather(
    ranks: Sequence[int], blocks: Sequence[Block], phase: str = "all-gather"
) -> Steps:
    """Ring all-gather; position ``i`` starts with block ``i + 1``.

    That is where :func:`ring_reduce_scatter` leaves the sums, so the two
    compose into an all-reduce without any reshuffling.
    """
    r, lo, hi, pos = _arrays(ranks, blocks)
    m = len(r)
    return Steps(
        m - 1,
        lambda s: _ring_step(r, lo, hi, pos, (pos + 1 - s) % m, (pos - s) % m, RECV_COPY, phase),
    )


def _direct_step(r, lo, hi, recv_kind: int, reduce: bool, phase: str) -> Step:
    """Every position ``i`` exchanges with every other ``j``: a reduce-scatter sends block
    ``j`` and receives block ``i`` (``reduce``), an all-gather the other way round."""
    i, j = np.nonzero(~np.eye(len(r), dtype=bool))  # all ordered pairs i != j, row by row
    sent, got = (j, i) if reduce else (i, j)  # block sent to j, block received from j
    return _pair_ops(r[i], r[j], r[j], sent, got, lo, hi, recv_kind, phase)


def direct_reduce_scatter(
    ranks: Sequence[int], blocks: Sequence[Block], phase: str = "reduce-scatter"
) -> tuple[Steps, dict[int, int]]:
    """Reduce-scatter in one step: position ``i`` sends block ``j`` to position ``j`` and
    adds block ``i`` from every other position (m − 1 messages each way, the ring's
    bytes in one step instead of m − 1). Returns the steps and ``holder`` (block ``i``:
    the rank at position ``i``), like :func:`ring_reduce_scatter`."""
    r, lo, hi, _ = _arrays(ranks, blocks)
    steps = Steps(
        1 if len(r) > 1 else 0, lambda s: _direct_step(r, lo, hi, RECV_REDUCE, True, phase)
    )
    return steps, {i: int(rank) for i, rank in enumerate(ranks)}


def direct_all_gather(
    ranks: Sequence[int], blocks: Sequence[Block], phase: str = "all-gather"
) -> Steps:
    """All-gather in one step; position ``i`` starts with block ``i`` (where
    :func:`direct_reduce_scatter` leaves it) and sends it to every other position."""
    r, lo, hi, _ = _arrays(ranks, blocks)
    return Steps(1 if len(r) > 1 else 0, lambda s: _direct_step(r, lo, hi, RECV_COPY, False, phase))


def split_block(block: Block, parts: int) -> list[Block]:
    """Cut a chunk range into ``parts`` equal sub-ranges (its length must divide)."""
    lo, hi = block
    n = hi - lo
    if n % parts:
        raise ValueError(f"block {block} of {n} chunks does not split into {parts} parts")
    w = n // parts
    return [(lo + k * w, lo + (k + 1) * w) for k in range(parts)]


def split_core(ranks: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(core, extras)``: the first q = 2^floor(log2 m) of ``ranks``, and the rest.

    Recursive halving and doubling pair rank ``i`` with ``i ^ d``, which
    needs a power of two; the ``m - q < q`` extras fold into the core
    around it (:func:`fold_in`, :func:`fold_out`).
    """
    ranks = tuple(ranks)
    q = 1 << (len(ranks).bit_length() - 1)
    return ranks[:q], ranks[q:]


def fold_in(core: Sequence[int], extras: Sequence[int], block: Block) -> list[Step]:
    """Extra ``j`` adds its ``block`` into core rank ``j`` (one step; none without extras)."""
    if not extras:
        return []
    ops = []
    for j, e in enumerate(extras):
        ops += [Op(OpKind.SEND, e, core[j], *block), Op(OpKind.RECV_REDUCE, core[j], e, *block)]
    return [Step.of(ops, "fold-in")]


def fold_out(core: Sequence[int], extras: Sequence[int], block: Block) -> list[Step]:
    """Core rank ``j`` hands the finished ``block`` back to extra ``j`` (one step; none
    without extras)."""
    if not extras:
        return []
    ops = []
    for j, e in enumerate(extras):
        ops += [Op(OpKind.SEND, core[j], e, *block), Op(OpKind.RECV_COPY, e, core[j], *block)]
    return [Step.of(ops, "fold-out")]


def pairwise_exchange(core: Sequence[int], distance: int, block: Block, phase: str) -> Step:
    """Core position ``i`` sends ``block`` to position ``i ^ distance`` and adds the one it gets.

    Every send reads the buffer as it was before the step, so both
    partners end with the sum of their two blocks.
    """
    r = np.asarray(core, dtype=np.int32)
    m = len(r)
    partner = r[np.arange(m) ^ distance]
    n = 2 * m
    kind = np.empty(n, np.int8)
    kind[0::2], kind[1::2] = SEND, RECV_REDUCE
    peer = np.repeat(partner, 2)
    lo, hi = np.full(n, block[0], np.int64), np.full(n, block[1], np.int64)
    return Step(kind, np.repeat(r, 2), peer, lo, hi, phase)
