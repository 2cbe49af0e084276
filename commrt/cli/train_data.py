"""``commrt train``'s data: the digits, this rank's share of them, and the test score.

The dataset is scikit-learn's handwritten digits (1797 8×8 images, 10
classes), which ships inside the scikit-learn package: nothing is
downloaded. :class:`Sharding` gives each rank its batches every epoch
(slices of one global shuffle, or for gossip its own shard, gossip-shuffled);
:func:`evaluate` scores the held-out 20% across the ranks.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

import commrt
from commrt.algorithms import Algorithm, Gossip
from commrt.cli.train_options import DIGITS_SAMPLES, TEST_FRACTION, TRAIN_SAMPLES  # noqa: F401


@dataclass
class Digits:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def digits_file() -> Path:
    """The digits' file inside the installed scikit-learn (``datasets/data/digits.csv.gz``:
    one row per image, its 64 pixels then its label, the file scikit-learn's own
    ``load_digits`` reads). Found without importing scikit-learn, whose ``datasets``
    package takes about a second to import: a second of every rank's start-up."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    where = f"in scikit-learn at {folders[0]}" if folders else "(no scikit-learn installed)"
    raise RuntimeError(
        f"commrt train needs scikit-learn's digits dataset, not found {where}: "
        "pip install 'commrt[train]'"
    )


def load_digits(seed: int = 0) -> Digits:
    """The digits data as float tensors scaled to [0, 1], split 80/20 with a fixed seed."""
    rows = np.loadtxt(digits_file(), delimiter=",")
    x = torch.tensor(rows[:, :-1], dtype=torch.float32) / 16.0
    y = torch.tensor(rows[:, -1].astype(np.int64))
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = perm[:n_test], perm[n_test:]
    return Digits(x[train], y[train], x[test], y[test])


def _shard(n: int, epoch: int, seed: int, rank: int, world: int, global_batch: int):
    """This rank's index batches for one epoch: slices of one global shuffle."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    local = global_batch // world
    steps = n // global_batch
    for s in range(steps):
        start = s * global_batch + rank * local
        yield perm[start : start + local]


def evaluate(model, data: Digits, comm, local: bool = False) -> float:
    """Accuracy on the test split, each rank scoring its share, summed over ranks
    (``local``: this rank scores all of it, with no collective)."""
    if local:
        with torch.no_grad():
            return (model(data.x_test).argmax(1) == data.y_test).float().mean().item()
    n = len(data.x_test)
    idx = torch.arange(comm.rank, n, comm.world_size, device=data.x_test.device)
    with torch.no_grad():
        pred = model(data.x_test[idx]).argmax(1)
    counts = torch.tensor(
        [(pred == data.y_test[idx]).sum().item(), len(idx)], dtype=torch.float64, device=comm.device
    )
    commrt.all_reduce(counts, comm, op="sum")
    return counts[0].item() / counts[1].item()


def _gossip_shard(data: Digits, seed: int, rank: int, world: int):
    """This rank's own disjoint 1/p of the training data as (x, y): equal sizes, one
    permutation from the seed."""
    n = len(data.x_train) // world
    perm = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(seed))
    mine = perm[rank * n : (rank + 1) * n].to(data.x_train.device)
    return data.x_train[mine].clone(), data.y_train[mine].clone()


def _local_batches(shard, batch: int, epoch: int, seed: int):
    """``shard``'s full batches of ``batch`` samples, in an order drawn from (seed, epoch)."""
    x, y = shard
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 1009 + epoch))
    order = order.to(x.device)
    for i in range(0, len(x) - batch + 1, batch):
        idx = order[i : i + batch]
        yield x[idx], y[idx]


class Sharding:
    """Where a rank's batches come from each epoch: slices of one global shuffle, or,
    for gossip (GossipGraD), the rank's own shard, half of it swapped with a gossip
    peer every epoch (the data choice follows the algorithm the user asked for).
    ``swap=False``: the gossip shards stay put, each reshuffled locally every epoch (a
    swap, or the shuffle's set-up, would wait on a dead peer or a replacement)."""

    def __init__(self, algorithm: Algorithm, data: Digits, comm, seed: int, swap: bool = True):
        self.data, self.comm, self.seed = data, comm, seed
        self.shuffle = self.shard = None
        if isinstance(algorithm, Gossip):
            shard = _gossip_shard(data, seed, comm.rank, comm.world_size)
            if swap:
                self.shuffle = commrt.data.GossipShuffle(shard, comm, fraction=0.5, seed=seed)
            else:
                self.shard = shard

    def steps(self, global_batch: int) -> int:
        """Steps one epoch of ``global_batch`` takes on each rank."""
        n, world = len(self.data.x_train), self.comm.world_size
        if self.shuffle is not None or self.shard is not None:
            return (n // world) // (global_batch // world)
        return n // global_batch

    def batches(self, epoch: int, global_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        comm = self.comm
        if self.shuffle is not None:
            return self.shuffle.batches(global_batch // comm.world_size, epoch, drop_last=True)
        if self.shard is not None:
            return _local_batches(self.shard, global_batch // comm.world_size, epoch, self.seed)
        d = self.data
        idxs = (
            i.to(comm.device)
            for i in _shard(
                len(d.x_train), epoch, self.seed, comm.rank, comm.world_size, global_batch
            )
        )
        return ((d.x_train[i], d.y_train[i]) for i in idxs)
