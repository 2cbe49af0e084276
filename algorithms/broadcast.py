"""Broadcast from one root: a binomial tree for small buffers, a pipelined chain for large ones.

Both are schedules like the all-reduces (RECV_COPY ops only), so they run
on every transport through the executor and the symbolic checker proves
that every rank ends with the root's data and nothing else.

* :class:`BinomialTree`: ⌈log2 p⌉ steps, each rank that already holds the
  buffer sends all of it to one rank that does not. Latency-optimal; the
  root's link carries ⌈log2 p⌉ whole copies.
* :class:`PipelinedChain`: the buffer is cut into ``chunks`` pieces that
  flow down the chain root → next → ... ; p - 2 + chunks steps, each moving
  1/chunks of the buffer per link. Bandwidth-optimal for large buffers.

:func:`choose` picks between them by size (what :func:`commrt.broadcast`
uses when no algorithm is given).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from commrt.algorithms.base import Algorithm, participants
from commrt.schedule import Collective, Op, OpKind, Schedule, Step, Steps

#: below this many bytes a broadcast takes the binomial tree (latency-bound)
TREE_MAX_BYTES = 256 << 10
#: each pipelined piece of a chain broadcast is about this large
CHAIN_PIECE_BYTES = 1 << 20


def _rooted(
    world_size: int, ranks: Sequence[int] | None, root: int | None
) -> tuple[tuple[int, ...], int]:
    """Participants rotated so that the root comes first (virtual rank 0)."""
    ranks = participants(world_size, ranks)
    root = ranks[0] if root is None else int(root)
    if root not in ranks:
        raise ValueError(f"root {root} is not among the participating ranks {list(ranks)}")
    k = ranks.index(root)
    return ranks, ranks[k:] + ranks[:k]


class _BroadcastAlgorithm(Algorithm):
    def supports(self, collective: Collective) -> bool:
        return collective is Collective.BROADCAST

    def _check(self, collective: Collective) -> None:
        if collective is not Collective.BROADCAST:
            raise ValueError(f"{self.name} implements broadcast only, not {collective.value}")


@dataclass(frozen=True)
class BinomialTree(_BroadcastAlgorithm):
    """Binomial-tree broadcast: in step k, virtual ranks v < 2^k send to v + 2^k.

    Example::

        >>> from commrt.algorithms.broadcast import BinomialTree
        >>> s = BinomialTree().schedule(5, root=4)
        >>> s.num_steps, s.check().ok
        (3, True)
    """

    name = "binomial_tree"

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.BROADCAST,
        root: int | None = None,
    ) -> Schedule:
        self._check(collective)
        ranks, virt = _rooted(world_size, ranks, root)
        m = len(virt)
        steps, d = [], 1
        while d < m:
            ops = []
            for v in range(min(d, m - d)):
                ops += [
                    Op(OpKind.SEND, virt[v], virt[v + d], 0, 1),
                    Op(OpKind.RECV_COPY, virt[v + d], virt[v], 0, 1),
                ]
            steps.append(Step.of(ops, f"tree{d}"))
            d *= 2
        return Schedule(
            self.name, collective, world_size, ranks, 1, tuple(steps), owners=(virt[0],)
        )


@dataclass(frozen=True)
class PipelinedChain(_BroadcastAlgorithm):
    """Chain broadcast in ``chunks`` pipelined pieces: at step s, the rank at
    chain position j forwards piece s - j to position j + 1.

    Example::

        >>> from commrt.algorithms.broadcast import PipelinedChain
        >>> PipelinedChain(chunks=4).schedule(3).num_steps   # p - 2 + chunks
        5
    """

    chunks: int = 8
    name = "chain"

    def __post_init__(self):
        if not isinstance(self.chunks, int) or self.chunks < 1:
            raise ValueError(f"chunks must be a positive integer, got {self.chunks!r}")

    @functools.lru_cache(maxsize=256)
    def schedule(
        self,
        world_size: int,
        ranks: Sequence[int] | None = None,
        collective: Collective = Collective.BROADCAST,
        root: int | None = None,
    ) -> Schedule:
        self._check(collective)
        ranks, chain = _rooted(world_size, ranks, root)
        m, n = len(chain), self.chunks

        def make(s: int) -> Step:
            ops = []
            for j in range(max(0, s - n + 1), min(m - 1, s + 1)):
                c = s - j
                ops += [
                    Op(OpKind.SEND, chain[j], chain[j + 1], c, c + 1),
                    Op(OpKind.RECV_COPY, chain[j + 1], chain[j], c, c + 1),
                ]
            return Step.of(ops, "chain")

        steps = Steps(m - 2 + n if m > 1 else 0, make)
        return Schedule(self.name, collective, world_size, ranks, n, steps, owners=(chain[0],) * n)


def choose(world_size: int, nbytes: int) -> Algorithm:
    """The broadcast for ``nbytes`` on ``world_size`` ranks: a tree when latency
    dominates (small buffers, or p <= 2 where both are one message), else a
    chain with pieces of about :data:`CHAIN_PIECE_BYTES`."""
    if nbytes <= TREE_MAX_BYTES or world_size <= 2:
        return BinomialTree()
    return PipelinedChain(chunks=max(2, min(64, nbytes // CHAIN_PIECE_BYTES)))
