"""Torch reference path: same semantics as the Triton kernels, fast on CPU.

Semantics (shared with :mod:`commrt.kernels._triton`): every value is widened
to fp32, multiplied / added in fp32, and rounded ONCE to the destination
dtype, round-to-nearest-even.

Why the code has several paths
------------------------------
On CPU, a torch op whose output dtype differs from its computation dtype
(``torch.mul(fp32, s, out=bf16)``, ``fp32.add_(bf16)``) silently allocates
a full-size temporary, and mixed-dtype in-place adds are 10-30x slower than a
copy (measured on this project's CI box). Worse, ``torch.mul(fp16, s,
out=fp32)`` computes in fp16 and would round twice. So:

* single-pass ops whenever one torch op has exactly the right semantics:
  ``copy_`` for any unscaled cast (it rounds RNE), ``torch.mul(..., out=)``
  for fp32 -> fp32, ``add_(..., alpha=)`` when everything is fp32;
* otherwise **staging**: walk the bucket in segments of at most ``CHUNK``
  elements through a reusable fp32 scratch buffer (2 MiB on CPU, kept per
  thread), so the extra pass stays in cache and no temporary ever has the
  size of the bucket;
* tensors smaller than ``SMALL`` are handled as *runs* (consecutive small
  tensors, at most ``CHUNK`` elements in all) with ``torch._foreach_*`` ops,
  so a bucket of many biases costs a few calls, not a Python loop per
  tensor.

Nothing here loops over elements in Python; the Python loops are over
tensors (large ones) and segments of ``CHUNK`` elements.
"""
from __future__ import annotations

import functools
import threading
from typing import List, Tuple

import torch

#: Staging segment, in elements, for CPU tensors (2 MiB of fp32: 512 K elements
#: measured best on a 1 MiB-L2 / 32 MiB-L3 machine for 4-100 MB buckets).
CHUNK = 1 << 19
#: Staging segment for CUDA tensors under impl="torch" (no cache to fit; fewer launches).
CUDA_CHUNK = 1 << 23
#: Tensors with fewer elements than this are batched into foreach runs.
SMALL = 1 << 16

_F32 = torch.float32
_local = threading.local()


def _scratch(device: torch.device, n: int, which: int) -> torch.Tensor:
    """fp32 scratch of ``n`` elements. CPU: reused per thread. CUDA: fresh from
    the caching allocator each call, so streams never share one buffer."""
    if device.type != "cpu":
        return torch.empty(n, dtype=_F32, device=device)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = [None, None]
    buf = bufs[which]
    if buf is None or buf.numel() < n:
        buf = bufs[which] = torch.empty(max(n, CHUNK), dtype=_F32)
    return buf[:n]


@functools.lru_cache(maxsize=256)
def _plan(sizes: Tuple[int, ...], chunk: int):
    """Group a tensor list into segments of the flat buffer.

    Returns a tuple of ``(lo, hi, pieces)`` with ``pieces`` a tuple of
    ``(tensor_index, start, stop)``: flat[lo:hi] holds, in order, the element
    ranges [start, stop) of those tensors. A segment is either a run of whole
    small tensors (at most ``chunk`` elements) or a piece (at most ``chunk``)
    of one large tensor. Zero-size tensors appear nowhere.
    """
    segs = []
    run, run_lo, run_n = [], 0, 0
    off = 0
    for i, n in enumerate(sizes):
        if n == 0:
            continue
        if n >= min(SMALL, chunk) or run_n + n > chunk:
            if run:
                segs.append((run_lo, run_lo + run_n, tuple(run)))
                run, run_n = [], 0
        if n >= min(SMALL, chunk):
            for a in range(0, n, chunk):
                b = min(a + chunk, n)
                segs.append((off + a, off + b, ((i, a, b),)))
        else:
            if not run:
                run_lo = off
            run.append((i, 0, n))
            run_n += n
        off += n
    if run:
        segs.append((run_lo, run_lo + run_n, tuple(run)))
    return tuple(segs)


def _chunk(device: torch.device) -> int:
    return CHUNK if device.type == "cpu" else CUDA_CHUNK


def _pieces(flats: List[torch.Tensor], pieces) -> List[torch.Tensor]:
    return [flats[i] if a == 0 and b == flats[i].numel() else flats[i][a:b] for i, a, b in pieces]


def _split(buf: torch.Tensor, pieces) -> List[torch.Tensor]:
    if len(pieces) == 1:
        return [buf]
    return list(buf.split([b - a for _, a, b in pieces]))


def _sizes(tensors) -> Tuple[int, ...]:
    return tuple(t.numel() for t in tensors)


def _nonempty(tensors, flat: torch.Tensor, total: int):
    """(1-D views of the non-empty tensors, matching 1-D views of flat[:total])."""
    sizes = _sizes(tensors)
    keep = [i for i, n in enumerate(sizes) if n]
    views = [tensors[i].view(-1) for i in keep]
    slots = list(flat[:total].split([sizes[i] for i in keep])) if keep else []
    return views, slots


@torch.no_grad()
def pack(tensors: List[torch.Tensor], out: torch.Tensor, scale: float, total: int) -> None:
    """out[off_i : off_i + n_i] = round(fp32(tensors[i]) * scale) for every i."""
    if total == 0:
        return
    if scale == 1.0:
        # copy_ casts with round-to-nearest-even: one pass, one call
        views, slots = _nonempty(tensors, out, total)
        torch._foreach_copy_(slots, views)
        return
    flats = [t.view(-1) for t in tensors]
    plan = _plan(_sizes(tensors), _chunk(out.device))
    if out.dtype == _F32:
        for lo, hi, pieces in plan:
            dst = out[lo:hi]
            i, a, b = pieces[0]
            if len(pieces) == 1 and flats[i].dtype == _F32:
                torch.mul(_pieces(flats, pieces)[0], scale, out=dst)  # one pass
            else:
                torch._foreach_copy_(_split(dst, pieces), _pieces(flats, pieces))  # exact widening
                dst.mul_(scale)  # second pass over a cache-sized segment
        return
    for lo, hi, pieces in plan:
        s = _scratch(out.device, hi - lo, 0)
        i, a, b = pieces[0]
        if len(pieces) == 1 and flats[i].dtype == _F32:
            torch.mul(flats[i][a:b], scale, out=s)
        else:
            torch._foreach_copy_(_split(s, pieces), _pieces(flats, pieces))
            s.mul_(scale)
        out[lo:hi].copy_(s)  # the one rounding to out.dtype


@torch.no_grad()
def unpack(flat: torch.Tensor, tensors: List[torch.Tensor], scale: float, accumulate: bool, total: int) -> None:
    """tensors[i] (=, or += in fp32) round(fp32(flat[off_i : off_i + n_i]) * scale)."""
    if total == 0:
        return
    dtypes = {t.dtype for t in tensors if t.numel()}
    if not accumulate and scale == 1.0:
        views, slots = _nonempty(tensors, flat, total)
        torch._foreach_copy_(views, slots)
        return
    if accumulate and flat.dtype == _F32 and dtypes == {_F32}:
        # everything fp32: one foreach call, one pass
        views, slots = _nonempty(tensors, flat, total)
        torch._foreach_add_(views, slots, alpha=scale)
        return
    flats = [t.view(-1) for t in tensors]
    for lo, hi, pieces in _plan(_sizes(tensors), _chunk(flat.device)):
        src = flat[lo:hi]
        dsts = _pieces(flats, pieces)
        if not accumulate and len(pieces) == 1 and flat.dtype == _F32 and dsts[0].dtype == _F32:
            torch.mul(src, scale, out=dsts[0])  # one pass
            continue
        s = _scratch(flat.device, hi - lo, 0)
        if flat.dtype == _F32:
            torch.mul(src, scale, out=s)
        else:
            s.copy_(src)
            if scale != 1.0:
                s.mul_(scale)
        if not accumulate:
            torch._foreach_copy_(dsts, _split(s, pieces))
        elif all(d.dtype == _F32 for d in dsts):
            torch._foreach_add_(dsts, _split(s, pieces))
        else:
            s2 = _scratch(flat.device, hi - lo, 1)
            s2_views = _split(s2, pieces)
            torch._foreach_copy_(s2_views, dsts)
            s2.add_(s)
            torch._foreach_copy_(dsts, s2_views)


@torch.no_grad()
def reduce_(dst: torch.Tensor, src: torch.Tensor, alpha: float, beta: float) -> None:
    """dst = round(alpha * fp32(dst) + beta * fp32(src)) on 1-D contiguous views."""
    n = dst.numel()
    if n == 0:
        return
    if alpha == 1.0 and (dst.dtype == src.dtype):
        # one op: computes in fp32 (opmath for fp16/bf16) and rounds once
        dst.add_(src, alpha=beta)
        return
    chunk = _chunk(dst.device)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        d, s = dst[lo:hi], src[lo:hi]
        if dst.dtype == _F32:
            if src.dtype != _F32:
                s = _scratch(dst.device, hi - lo, 0).copy_(s)
            if alpha != 1.0:
                d.mul_(alpha)
            d.add_(s, alpha=beta)
            continue
        acc = _scratch(dst.device, hi - lo, 1).copy_(d)
        if alpha != 1.0:
            acc.mul_(alpha)
        if src.dtype != _F32:
            s = _scratch(dst.device, hi - lo, 0).copy_(s)
        acc.add_(s, alpha=beta)
        d.copy_(acc)
