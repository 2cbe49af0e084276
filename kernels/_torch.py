"""Torch reference path: same semantics as the Triton kernels, fast on CPU.

Semantics (shared with :mod:`commrt.kernels._triton`): every value is widened
to fp32, multiplied / added in fp32, and rounded ONCE to the destination
dtype, round-to-nearest-even.

Why the code has several paths
------------------------------
On CPU, a torch op whose output dtype differs from its computation dtype
(``torch.mul(fp32, s, out=bf16)``, ``fp32.add_(bf16)``) silently allocates a
full-size temporary, and mixed-dtype in-place adds run many times slower
than a copy. Worse, ``torch.mul(fp16, s, out=fp32)`` computes in fp16 and
would round twice. So:

* single-pass ops whenever one torch op has exactly the right semantics:
  ``copy_`` for any unscaled cast (it rounds to nearest even),
  ``torch.mul(..., out=)`` for fp32 -> fp32, ``add_(..., alpha=)`` when
  everything is fp32;
* otherwise **staging**: walk the bucket in segments of at most ``CHUNK``
  elements through a reusable fp32 scratch buffer (2 MiB on CPU, kept per
  thread), so the extra pass stays in cache and no temporary ever has the
  size of the bucket;
* small tensors are batched (up to ``CHUNK`` elements per batch, wherever
  they sit in the bucket) and go through ``torch._foreach_*`` ops, so a
  bucket of many biases costs a few calls, not a Python loop per tensor;
  each large tensor gets its own single-pass op where one exists.

Per-tensor overhead is the cost that dominates small buckets (every tensor
view is a torch call), so the *slots* -- views of the flat buffer shaped like each
tensor -- are cached per flat buffer (weakly keyed: the cache entry dies with
the buffer tensor). Pass the same bucket tensor each step to benefit.

Nothing loops over elements in Python; the Python loops are over large
tensors, batches of small ones and pieces of ``CHUNK`` elements.
"""

from __future__ import annotations

import functools
import threading
from typing import List, Sequence, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

#: Staging segment, in elements, for CPU tensors (2 MiB of fp32: small enough that a
#: segment's passes stay in cache, large enough that the calls per bucket are few).
CHUNK = 1 << 19
#: Staging segment for CUDA tensors under impl="torch" (no cache to fit; fewer launches).
CUDA_CHUNK = 1 << 23
#: Tensors with fewer elements than this (1 MiB of fp32) are grouped into
#: runs; larger ones get their own (single-pass where possible) ops.
SMALL = 1 << 18

_F32 = torch.float32


class _Scratch(threading.local):
    """Each thread's two CPU scratch buffers: ``bufs``, None until first asked for
    (``threading.local`` runs ``__init__`` once per thread, on its first use)."""

    def __init__(self):
        self.bufs: list[torch.Tensor | None] = [None, None]


_local = _Scratch()


def _chunk(device: torch.device) -> int:
    return CHUNK if device.type == "cpu" else CUDA_CHUNK


def _scratch(device: torch.device, n: int, which: int) -> torch.Tensor:
    """fp32 scratch tensor of >= ``n`` elements (slice it). CPU: the same
    buffer per thread every call. CUDA: fresh from the caching allocator, so
    two streams never share one buffer."""
    if device.type != "cpu":
        return torch.empty(n, dtype=_F32, device=device)
    bufs = _local.bufs
    buf = bufs[which]
    if buf is None or buf.numel() < n:
        buf = bufs[which] = torch.empty(max(n, CHUNK), dtype=_F32)
    return buf


# ----------------------------------------------------------------------------
# slots: views of a flat buffer shaped like the tensors, cached per buffer
# ----------------------------------------------------------------------------

_SLOTS: "WeakIdKeyDictionary" = WeakIdKeyDictionary()
_SLOTS_PER_BUFFER = 64
_slots_lock = threading.Lock()


def _slots(buf: torch.Tensor, start: int, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Views ``v_i`` of ``buf`` with ``v_i.shape == tensors[i].shape``, laid end to
    end from element ``start``. Cached on (buffer object, its data_ptr, start, shapes)."""
    key = (buf.data_ptr(), start, tuple(t.shape for t in tensors))
    with _slots_lock:
        per = _SLOTS.get(buf)
        if per is not None:
            hit = per.get(key)
            if hit is not None:
                return hit
    sizes = [t.numel() for t in tensors]
    # views of a detached alias: a view of `buf` itself would keep `buf` (the
    # weak key) alive through its ._base, and the entry would never die
    flat = buf.detach()[start : start + sum(sizes)]
    views = [v.view(t.shape) for v, t in zip(flat.split(sizes), tensors)]
    with _slots_lock:
        per = _SLOTS.get(buf)
        if per is None:
            per = _SLOTS[buf] = {}
        if len(per) >= _SLOTS_PER_BUFFER:
            per.pop(next(iter(per)))
        per[key] = views
    return views


class _Plan:
    """How one tensor list is processed (cached per list of sizes).

    ``big``: indices of tensors with >= ``small`` elements, each handled by
    its own ops (a single pass when one torch op fits). ``batches``: runs of
    consecutive smaller tensors (zero-size ones skipped), at most ``chunk``
    elements per run, each handled by a few whole-run ops (``foreach`` calls
    and one op over the run's contiguous range of the flat buffer) whatever
    its length. Runs, not arbitrary groups: ``torch._foreach_mul_`` still pays
    per tensor, one ``mul_`` over a contiguous range costs one call.
    ``spans[k]``: the range ``(lo, hi)`` of the flat buffer run k fills.
    ``offsets[i]``: where tensor i starts in the flat buffer.
    """

    __slots__ = ("big", "batches", "spans", "offsets")

    def __init__(self, sizes: Tuple[int, ...], chunk: int, small: int):
        self.offsets, self.big, self.batches, self.spans = [], [], [], []
        cur, cur_lo, off = [], 0, 0

        def close(end):
            if cur:
                self.batches.append(list(cur))
                self.spans.append((cur_lo, end))
                cur.clear()

        for i, n in enumerate(sizes):
            self.offsets.append(off)
            if n >= small:
                close(off)
                self.big.append(i)
            elif n:
                if cur and off + n - cur_lo > chunk:
                    close(off)
                if not cur:
                    cur_lo = off
                cur.append(i)
            off += n
        close(off)


@functools.lru_cache(maxsize=256)
def _cached_plan(sizes: Tuple[int, ...], chunk: int, small: int) -> _Plan:
    return _Plan(sizes, chunk, small)


def _plan(sizes: Tuple[int, ...], chunk: int) -> _Plan:
    return _cached_plan(sizes, chunk, min(SMALL, chunk))


def _pieces(lo: int, hi: int, chunk: int):
    for a in range(lo, hi, chunk):
        yield a, min(a + chunk, hi)


# ----------------------------------------------------------------------------
# pack
# ----------------------------------------------------------------------------


def _no_grad(fn):
    """Run ``fn`` with autograd off (out= and in-place ops on leaves that
    require grad would fail otherwise), entering no_grad only when needed:
    the context manager's cost is a visible share for small buckets."""

    @functools.wraps(fn)
    def wrapper(*args):
        if torch.is_grad_enabled():
            with torch.no_grad():
                return fn(*args)
        return fn(*args)

    return wrapper


@_no_grad
def pack(
    tensors: List[torch.Tensor], out: torch.Tensor, scale: float, sizes: Tuple[int, ...]
) -> None:
    """out[off_i : off_i + n_i] = round(fp32(tensors[i]) * scale) for every i (n_i = sizes[i])."""
    if not any(sizes):
        return
    slots = _slots(out, 0, tensors)
    if scale == 1.0:
        torch._foreach_copy_(slots, tensors)  # copy_ rounds to nearest even: one pass, one call
        return
    dev = out.device
    chunk = _chunk(dev)
    plan = _plan(sizes, chunk)
    out32 = out.dtype == _F32
    for idx, (lo, hi) in zip(plan.batches, plan.spans):  # runs of small tensors
        ts = [tensors[i] for i in idx]
        if out32:
            if len(ts) == 1 and ts[0].dtype == _F32:
                torch.mul(ts[0], scale, out=slots[idx[0]])  # one op
                continue
            torch._foreach_copy_([slots[i] for i in idx], ts)  # exact widening
            out[lo:hi].mul_(scale)  # second pass over the run, in cache
        else:
            buf = _scratch(dev, hi - lo, 0)[: hi - lo]
            if len(ts) == 1 and ts[0].dtype == _F32:
                torch.mul(ts[0].view(-1), scale, out=buf)
            else:
                torch._foreach_copy_(_slots(buf, 0, ts), ts)
                buf.mul_(scale)
            out[lo:hi].copy_(buf)  # the one rounding to out.dtype
    for i in plan.big:
        t = tensors[i]
        if out32 and t.dtype == _F32:
            torch.mul(t, scale, out=slots[i])  # one pass
            continue
        src, lo = t.view(-1), plan.offsets[i]
        for a, b in _pieces(0, t.numel(), chunk):
            dst = out[lo + a : lo + b]
            if out32:  # exact widening into out, then scale while it is in cache
                dst.copy_(src[a:b])
                dst.mul_(scale)
            else:
                dst.copy_(_scaled(src[a:b], scale, dev))  # the one rounding to out.dtype


# ----------------------------------------------------------------------------
# unpack
# ----------------------------------------------------------------------------


@_no_grad
def unpack(
    flat: torch.Tensor,
    tensors: List[torch.Tensor],
    scale: float,
    accumulate: bool,
    sizes: Tuple[int, ...],
) -> None:
    """tensors[i] (=, or += in fp32) round(fp32(flat[off_i : off_i + n_i]) * scale) (n_i = sizes[i])."""
    if not any(sizes):
        return
    slots = _slots(flat, 0, tensors)
    flat32 = flat.dtype == _F32
    if not accumulate and scale == 1.0:
        torch._foreach_copy_(tensors, slots)
        return
    if accumulate and flat32 and all(t.dtype == _F32 for t in tensors):
        torch._foreach_add_(tensors, slots, alpha=scale)  # one call, one pass
        return
    dev = flat.device
    chunk = _chunk(dev)
    plan = _plan(sizes, chunk)
    for idx, (lo, hi) in zip(plan.batches, plan.spans):  # runs of small tensors
        ts = [tensors[i] for i in idx]
        if not accumulate and flat32 and len(ts) == 1 and ts[0].dtype == _F32:
            torch.mul(slots[idx[0]], scale, out=ts[0])  # one op
            continue
        buf = _scratch(dev, hi - lo, 0)
        s = _scaled(flat[lo:hi], scale, dev, into=buf[: hi - lo])
        _write_back(ts, _slots(buf, 0, ts), s, accumulate, dev)
    for i in plan.big:
        t = tensors[i]
        if not accumulate and flat32 and t.dtype == _F32:
            torch.mul(slots[i], scale, out=t)  # one pass
            continue
        dst, lo = t.view(-1), plan.offsets[i]
        for a, b in _pieces(0, t.numel(), chunk):
            s = _scaled(flat[lo + a : lo + b], scale, dev)
            _write_back([dst[a:b]], [s], s, accumulate, dev)


def _write_back(ts, stage, stage_flat, accumulate: bool, dev) -> None:
    """ts[k] = round(stage[k]), or round(fp32(ts[k]) + stage[k]) when accumulating."""
    if not accumulate:
        torch._foreach_copy_(ts, stage)
    elif all(t.dtype == _F32 for t in ts):
        torch._foreach_add_(ts, stage)
    else:  # widen the destinations, add in fp32, round once
        n = stage_flat.numel()
        buf2 = _scratch(dev, n, 1)
        acc = _slots(buf2, 0, ts) if len(ts) > 1 else [buf2[:n].view(ts[0].shape)]
        torch._foreach_copy_(acc, ts)
        buf2[:n].add_(stage_flat)
        torch._foreach_copy_(ts, acc)


def _scaled(
    src: torch.Tensor, scale: float, dev: torch.device, into: torch.Tensor = None
) -> torch.Tensor:
    """fp32(src) * scale into a scratch segment (or ``into``)."""
    s = into if into is not None else _scratch(dev, src.numel(), 0)[: src.numel()]
    if src.dtype == _F32:
        torch.mul(src, scale, out=s)
    else:
        s.copy_(src)
        if scale != 1.0:
            s.mul_(scale)
    return s


# ----------------------------------------------------------------------------
# reduce
# ----------------------------------------------------------------------------


@_no_grad
def reduce_(dst: torch.Tensor, src: torch.Tensor, alpha: float, beta: float) -> None:
    """dst = round(alpha * fp32(dst) + beta * fp32(src)) on 1-D contiguous views."""
    n = dst.numel()
    if n == 0:
        return
    if alpha == 1.0 and dst.dtype == src.dtype:
        # one op, one pass: computes in fp32 (opmath for fp16/bf16), rounds once
        dst.add_(src, alpha=beta)
        return
    dev = dst.device
    for lo, hi in _pieces(0, n, _chunk(dev)):
        d, s = dst[lo:hi], src[lo:hi]
        if src.dtype != _F32:
            s = _scratch(dev, hi - lo, 0)[: hi - lo].copy_(s)  # exact widening
        if dst.dtype == _F32:
            if alpha != 1.0:
                d.mul_(alpha)
            d.add_(s, alpha=beta)
        else:
            acc = _scratch(dev, hi - lo, 1)[: hi - lo].copy_(d)
            if alpha != 1.0:
                acc.mul_(alpha)
            acc.add_(s, alpha=beta)
            d.copy_(acc)
