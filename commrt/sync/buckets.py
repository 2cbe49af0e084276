"""Gradient buckets: which parameters travel together, and a layout check.

Parameters go into buckets in *reverse registration order*, the order in
which backward produces their gradients, so the first bucket fills (and
can leave) while backward is still running. The first bucket is kept
small (``first_bucket_mb``, 1 MB by default as in PyTorch DDP) so that
communication starts early; the others are capped by ``bucket_mb``. A
parameter larger than the cap gets a bucket of its own, except that a tiny
leftover before it (less than 1/8 of the cap, typically a bias) joins it
rather than paying a collective's latency alone.

:func:`check_layout` makes every rank compare its buckets with everyone
else's before any gradient moves, so a rank with a different model fails
fast, with the difference in the message, on every rank.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

from commrt.errors import CommError

MB = 1 << 20


@dataclass(frozen=True, eq=False)
class Bucket:
    """Parameters whose gradients are packed into one flat buffer."""

    index: int
    params: tuple[torch.nn.Parameter, ...]
    names: tuple[str, ...]
    offsets: tuple[int, ...]  # element offset of each parameter in the buffer
    numel: int

    def __repr__(self) -> str:
        return f"Bucket({self.index}, {len(self.params)} params, {self.numel} elements)"


def assign_buckets(
    named_params: Sequence[tuple[str, torch.nn.Parameter]],
    bucket_bytes: int,
    first_bucket_bytes: int,
    element_size: int,
) -> list[Bucket]:
    """Group parameters (given in registration order) into buckets, last first."""
    if bucket_bytes <= 0 or first_bucket_bytes <= 0:
        raise ValueError("bucket sizes must be positive")
    buckets: list[Bucket] = []
    cur: list[tuple[str, torch.nn.Parameter]] = []
    cur_bytes = 0

    def close():
        nonlocal cur, cur_bytes
        if cur:
            offs, off = [], 0
            for _, p in cur:
                offs.append(off)
                off += p.numel()
            buckets.append(
                Bucket(
                    len(buckets),
                    tuple(p for _, p in cur),
                    tuple(n for n, _ in cur),
                    tuple(offs),
                    off,
                )
            )
        cur, cur_bytes = [], 0

    for name, p in reversed(list(named_params)):
        cap = first_bucket_bytes if not buckets else bucket_bytes
        nbytes = p.numel() * element_size
        # A tiny leftover (a bias after a large weight) would be a bucket of
        # its own, paying a whole collective's latency for a few KB: it rides
        # with the next tensor instead. The first bucket stays strictly small.
        tiny = buckets and cur_bytes < cap / 8
        if cur and cur_bytes + nbytes > cap and not tiny:
            close()
        cur.append((name, p))
        cur_bytes += nbytes
    close()
    return buckets


def describe(buckets: Sequence[Bucket], element_size: int, shown: int = 6) -> str:
    """``"3 buckets [1.00, 4.20, 0.31] MiB"``: the first ``shown`` sizes in wire MiB."""
    sizes = ", ".join(f"{b.numel * element_size / MB:.2f}" for b in buckets[:shown])
    more = ", ..." if len(buckets) > shown else ""
    return f"{len(buckets)} buckets [{sizes}{more}] MiB"


def _fingerprint(buckets: Sequence[Bucket], extra: str) -> list[int]:
    h = hashlib.blake2b(extra.encode(), digest_size=7)
    nparams = 0
    for b in buckets:
        h.update(f"|{b.index}:{b.numel}".encode())
        for p in b.params:
            h.update(f"{tuple(p.shape)}{p.dtype}".encode())
            nparams += 1
    return [
        int.from_bytes(h.digest(), "little"),
        len(buckets),
        nparams,
        sum(b.numel for b in buckets),
    ]


def check_layout(comm, buckets: Sequence[Bucket], extra: str = "") -> None:
    """Raise on every rank if any rank's bucket layout differs from rank 0's.

    One small exchange (:func:`~commrt.collectives.core.gather_rows`), so a
    mismatch can never deadlock: every rank gets every row and the same
    verdict. ``extra`` folds options that must agree (wire dtype,
    algorithm) into the fingerprint.
    """
    from commrt.collectives.core import gather_rows  # avoid an import cycle

    rows = gather_rows(comm, _fingerprint(buckets, extra), torch.int64)
    bad = [r for r, row in enumerate(rows) if row != rows[0]]
    if bad:

        def say(r):
            _, nb, npar, nel = rows[r]
            return f"rank {r}: {npar} parameters, {nel} elements, {nb} buckets"

        same = (
            ""
            if any(rows[r][1:] != rows[0][1:] for r in bad)
            else " (same counts: shapes, dtypes, bucket_mb, comm_dtype or algorithm differ)"
        )
        raise CommError(
            f"commrt: gradient layouts differ across ranks{same}: {say(0)}; "
            + "; ".join(say(r) for r in bad[:4])
            + ". Every rank must build the same model (same parameters that require grad, "
            "in the same order) with the same GradientSync options."
        )
