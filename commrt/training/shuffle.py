"""GossipGraD's asynchronous distributed shuffle of training samples.

Each rank trains on its own shard. So that no rank keeps seeing (and
overfitting) the same samples, every epoch each rank swaps a ``fraction``
of its shard with that epoch's gossip peer
(:meth:`Gossip.peers(rank, epoch, p) <commrt.algorithms.Gossip.peers>`):
the samples themselves travel as non-blocking point-to-point messages on
the communicator's transport, posted when the epoch's iteration starts and
completed when it ends, so they fly while the epoch computes.

Invariants: the shard size never changes, and the global multiset of
samples is kept exactly (every rank sends the same number of samples, and
each one is received by exactly one rank). The batches of epoch e come from
the shard as it was when the epoch started; the swap lands at its end, so
the batches and the resulting shards are the same whether the transfers
overlap the epoch or are forced to finish first (``overlap=False``).

The transfers share the communicator with a running GradientSync (under
MPI with ``MPI_THREAD_MULTIPLE``, as mpi4py initialises it, and under gloo;
they use a tag range of their own). NCCL groups from two threads could
interleave, so on nccl the swap runs as a blocking exchange at the start of
the epoch, after any gradient work in flight has finished.
"""

from __future__ import annotations

import math
import zlib
from typing import Iterator, Sequence

import numpy as np
import torch

from commrt.algorithms.gossip import Gossip, Topology
from commrt.collectives.core import gather_rows
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where

__all__ = ["GossipShuffle"]


def _signature(tensors) -> int:
    """A hash of the per-sample shapes and dtypes (must agree across ranks)."""
    text = "|".join(f"{tuple(t.shape[1:])}{t.dtype}" for t in tensors)
    return zlib.crc32(text.encode())


class GossipShuffle:
    """This rank's shard of the training data, gossip-shuffled every epoch.

    Args:
        tensors: this rank's shard, e.g. ``(x, y)``, tensors with the same
            first dimension (the samples), on ``comm.device``. Updated in
            place as samples move (pass clones to keep the originals).
        comm: a :class:`~commrt.Communicator`; every rank must pass shards
            of the same length and per-sample shapes and dtypes.
        fraction: share of the shard swapped per epoch, in [0, 1].
        seed: seeds the choice of samples, the batch order and (unless
            ``gossip`` is given) the peer rotation.
        gossip: whose peers to follow; default ``Gossip("hypercube")`` for
            a power-of-two p, else ``Gossip("dissemination")``, rotating.
        overlap: False forces each epoch's transfers to finish before its
            first batch (same batches and shards, no overlap).

    Bad input (fraction outside [0, 1], shards of different lengths or
    sample shapes across ranks, a hypercube on a p that is not a power of
    two) raises ValueError on every rank at construction, after one small
    exchange, so no rank is left waiting.

    Example::

        >>> x, y = torch.randn(256, 8), torch.randint(0, 10, (256,))
        >>> shuffle = commrt.data.GossipShuffle((x, y), comm, fraction=0.5, seed=0)
        >>> for epoch in range(2):
        ...     for xb, yb in shuffle.batches(32, epoch):
        ...         pass                                 # a training step on (xb, yb)
    """

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        comm,
        fraction: float = 0.5,
        seed: int = 0,
        *,
        gossip: Gossip | None = None,
        overlap: bool = True,
    ):
        self.comm = comm
        self.overlap = bool(overlap)
        self.seed = seed
        p = comm.world_size
        problem = ""
        if isinstance(tensors, torch.Tensor):
            tensors = (tensors,)
        tensors = tuple(tensors) if isinstance(tensors, (list, tuple)) else ()
        if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in tensors):
            problem = "tensors must be a non-empty sequence of tensors with a sample dimension"
        elif len({t.shape[0] for t in tensors}) != 1:
            problem = (
                f"its tensors have different numbers of samples {[t.shape[0] for t in tensors]}"
            )
        elif any(t.device.type != comm.device.type for t in tensors):
            problem = f"its tensors must live on {comm.device}"
        ok_fraction = (
            isinstance(fraction, (int, float))
            and not isinstance(fraction, bool)
            and 0 <= fraction <= 1
        )
        if not problem and not ok_fraction:
            problem = f"fraction must be a number in [0, 1], got {fraction!r}"
        if not problem and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            problem = f"seed must be a non-negative integer, got {seed!r}"
        if not problem:
            try:
                default = Topology.HYPERCUBE if p & (p - 1) == 0 else Topology.DISSEMINATION
                gossip = gossip if gossip is not None else Gossip(default, rotate=True, seed=seed)
                gossip.period_length(p)
            except (ValueError, AttributeError) as e:
                problem = f"gossip: {e}"
        n = tensors[0].shape[0] if not problem else -1
        row = [
            1.0 if problem else 0.0,
            float(n),
            float(fraction) if ok_fraction else math.nan,
            float(_signature(tensors) if not problem else -1),
        ]
        # everybody learns everybody's verdict, so a problem on one rank raises on all
        rows = gather_rows(comm, row, torch.float64)
        bad = [r for r, rw in enumerate(rows) if rw[0]]
        if bad:
            mine = f" (here: {problem})" if problem else ""
            raise ValueError(f"commrt.data.GossipShuffle: bad input on rank(s) {bad}{mine}")
        lengths = [int(rw[1]) for rw in rows]
        if len(set(lengths)) != 1:
            raise ValueError(
                "commrt.data.GossipShuffle: shards of different lengths on different ranks "
                f"({', '.join(f'rank {r}: {k}' for r, k in enumerate(lengths))}); every rank "
                f"must pass the same number of samples so that the swaps balance"
            )
        if len({rw[2] for rw in rows}) != 1:
            raise ValueError(
                "commrt.data.GossipShuffle: fraction differs across ranks: "
                f"{[rw[2] for rw in rows]}"
            )
        if len({rw[3] for rw in rows}) != 1:
            raise ValueError(
                "commrt.data.GossipShuffle: per-sample shapes or dtypes differ across ranks"
            )
        self._tensors = tensors
        self.fraction = float(fraction)
        self.gossip = gossip
        self._swap: _Swap | None = None  # the last epoch's swap, until it has landed
        self._iterating = False

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The current shard: during an epoch the one its batches come from, after it
        the one with the epoch's swap applied."""
        if self._swap is not None and not self._iterating:
            self._land()
        return self._tensors

    def __len__(self) -> int:
        return int(self._tensors[0].shape[0])

    @property
    def swap_count(self) -> int:
        """Samples sent (and received) per epoch."""
        return int(round(self.fraction * len(self))) if self.comm.world_size > 1 else 0

    def peers(self, epoch: int) -> tuple[int, int]:
        """``(send_to, recv_from)`` of this rank in ``epoch``."""
        return self.gossip.peers(self.comm.rank, epoch, self.comm.world_size)

    def batches(
        self, batch_size: int, epoch: int, *, drop_last: bool = False
    ) -> Iterator[tuple[torch.Tensor, ...]]:
        """This epoch's mini-batches (a tuple of tensors each), while the swap is in flight.

        Collective per epoch: every rank iterates (or closes the iterator)
        for each epoch, in the same order. Breaking out early still
        completes the swap (when the generator is closed).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._land()
        self._iterating = False
        n, comm = len(self), self.comm
        rng = np.random.default_rng([self.seed, epoch, comm.rank])
        k = self.swap_count
        out_idx = torch.from_numpy(np.sort(rng.choice(n, k, replace=False))).to(comm.device)
        order = torch.from_numpy(rng.permutation(n)).to(comm.device)
        send_to, recv_from = self.peers(epoch)
        if k and send_to != comm.rank:
            self._swap = _Swap(self.comm, self._tensors, epoch, out_idx, send_to, recv_from)
            if not self.overlap or comm.transport.traits.stream_ordered:
                self._swap.wait()
        return self._iterate(order, batch_size, drop_last)

    def _land(self) -> None:
        """Finish the last epoch's swap and write the samples received into the shard."""
        swap, self._swap = self._swap, None
        if swap is not None:
            swap.wait()
            for t, got in zip(self._tensors, swap.received):
                t[swap.out_idx] = got

    def _iterate(self, order, batch_size, drop_last):
        mine = self._swap
        self._iterating = True
        try:
            stop = len(order) - len(order) % batch_size if drop_last else len(order)
            for i in range(0, stop, batch_size):
                idx = order[i : i + batch_size]
                # copies (advanced indexing), so the swap landing later never changes them
                yield tuple(t[idx] for t in self._tensors)
        finally:
            # an iterator closed late (after the next epoch began) must not land that epoch's swap
            if self._swap is mine:
                self._iterating = False
                self._land()


class _Swap:
    """One epoch's non-blocking exchange of samples with the gossip peers."""

    def __init__(
        self,
        comm,
        tensors: Sequence[torch.Tensor],
        epoch: int,
        out_idx: torch.Tensor,
        send_to: int,
        recv_from: int,
    ):
        self.epoch, self.out_idx = epoch, out_idx
        self.sends = [(t[out_idx].contiguous(), send_to) for t in tensors]
        self.recvs = [
            (
                torch.empty((len(out_idx),) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device),
                recv_from,
            )
            for t in tensors
        ]
        self.received = [t for t, _ in self.recvs]
        blocking = comm.transport.traits.stream_ordered
        if blocking:
            # NCCL: no other thread may enqueue a group meanwhile; let gradient work finish first
            comm.syncs.quiesce()
        self.exchange = Exchange(
            comm,
            self.sends,
            self.recvs,
            tags.shuffle(epoch),
            Where("gossip-shuffle", step=epoch),
            hold_lock=blocking,
        )
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        self.done = True
        self.exchange.complete()
