"""Coalescing: many small tensors through a collective as a few bounded flat buffers.

A model of thousands of small tensors then costs a handful of messages,
not thousands, and the temporary copy never exceeds ``max_bytes``.
:func:`commrt.average_parameters`, the initial broadcast of
:class:`~commrt.GradientSync` and the backup workers' snapshots all go
through here: the snapshots, which hold tensors of mixed dtypes in one
byte buffer, through :func:`byte_layout` and :func:`byte_views`.

Example::

    >>> from commrt.collectives.coalesce import coalesced
    >>> for group in coalesced(params, max_bytes=64 << 20, wire=torch.float64):
    ...     commrt.all_reduce(group.flat, comm, op="sum")   # doctest: +SKIP
    ...     group.copy_back()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch


@dataclass
class Group:
    """Consecutive tensors packed into one flat buffer of their wire dtype."""

    tensors: list[torch.Tensor]
    flat: torch.Tensor

    def views(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(tensor, its slice of ``flat`` shaped like it), in order."""
        offset = 0
        for t in self.tensors:
            yield t, self.flat[offset : offset + t.numel()].view(t.shape)
            offset += t.numel()

    def copy_back(self) -> None:
        """Write the flat buffer's contents back into the tensors (cast to their dtypes)."""
        with torch.no_grad():
            for t, view in self.views():
                t.copy_(view)


def bounded_runs(sizes: Sequence[int], limit: int) -> list[range]:
    """Split consecutive items of ``sizes`` into runs whose total stays within ``limit``
    (an item larger than ``limit`` gets a run of its own). Linear in the number of items."""
    runs, start, total = [], 0, 0
    for i, n in enumerate(sizes):
        if i > start and total + n > limit:
            runs.append(range(start, i))
            start, total = i, 0
        total += n
    if start < len(sizes):
        runs.append(range(start, len(sizes)))
    return runs


def coalesced(
    tensors: Sequence[torch.Tensor],
    *,
    max_bytes: int,
    wire: torch.dtype | Callable[[torch.dtype], torch.dtype] | None = None,
) -> Iterator[Group]:
    """Pack ``tensors`` into flat buffers of at most ``max_bytes`` each, one wire dtype per
    buffer; yield each :class:`Group` (its buffer made just before it is yielded).

    ``wire``: the dtype every tensor travels as, a function from a tensor's dtype to its
    wire dtype, or None to keep each tensor's own. Tensors are grouped by wire dtype in a
    fixed order (by the dtype's name), so every rank that passes the same structure builds
    the same groups. The caller runs its collective on ``group.flat`` and then calls
    ``group.copy_back()`` (or reads ``group.views()``).
    """
    pick = wire if callable(wire) else (lambda d: wire if wire is not None else d)
    by_wire: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_wire.setdefault(pick(t.dtype), []).append(t)
    for dtype in sorted(by_wire, key=str):
        same = by_wire[dtype]
        for run in bounded_runs([t.numel() * dtype.itemsize for t in same], max_bytes):
            group = [same[i] for i in run]
            with torch.no_grad():
                flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in group])
            yield Group(group, flat)


def aligned(nbytes: int, align: int) -> int:
    """``nbytes`` rounded up to a multiple of ``align``."""
    return (nbytes + align - 1) // align * align


def byte_layout(
    specs: Sequence[tuple[torch.dtype, Sequence[int]]], align: int = 8
) -> tuple[list[int], int]:
    """Where tensors of these ``(dtype, shape)`` go when packed one after another into one
    byte buffer, each at a multiple of ``align`` (so that every view of it is aligned for its
    dtype): their byte offsets, and the buffer's size."""
    offsets, total = [], 0
    for dtype, shape in specs:
        offsets.append(total)
        total += aligned(dtype.itemsize * math.prod(shape), align)
    return offsets, total


def byte_views(
    flat: torch.Tensor, specs: Sequence[tuple[torch.dtype, Sequence[int]]], align: int = 8
) -> list[torch.Tensor]:
    """Views of the ``uint8`` buffer ``flat`` as the tensors of :func:`byte_layout`, in order
    (copy into them to pack, out of them to unpack)."""
    offsets, _ = byte_layout(specs, align)
    return [
        flat[o : o + dtype.itemsize * math.prod(shape)].view(dtype).view(list(shape))
        for o, (dtype, shape) in zip(offsets, specs, strict=True)
    ]
