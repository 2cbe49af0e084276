"""Triton kernels: fused pack (scale + cast), unpack (scale + cast [+ add]), reduce;
the host side (pointer tables, chunk size, launches).

Imported lazily by :mod:`commrt.kernels._common` the first time a Triton path
is chosen, so machines without Triton can still use the torch reference.

How a list of tensors gets into ONE launch
------------------------------------------
The host builds a small int64 table per tensor list (cached, see
:func:`_tables`): each tensor's ``data_ptr()``, its element offset in the
flat buffer, its element count, its dtype code and the index of its first
*chunk*; plus one entry per chunk naming the tensor that owns it. A chunk is
``chunk`` consecutive elements of one tensor (the last chunk of a tensor may
be short), and the grid is one program per chunk, i.e. a *flattened block
table*. Why not a 2-D grid of (tensor, block)? Gradient lists mix 100 M and
10-element tensors; a 2-D grid would size every row for the largest tensor
and launch mostly empty programs. The flattened table launches exactly the
work there is, every program does the same amount of it (load balance), and a
chunk never straddles two tensors, so a program needs no search.

A new table goes to the GPU from pinned memory, without a host wait (torch's
pinned allocator keeps the block until the copy has run). A copy from pageable
memory waits on the host for the current stream; on the torch backend's call
thread that is a CUDA call waiting for the device between NCCL launches while
another thread drives another communicator (a send's pair communicator): the
deadlock NCCL's "Using multiple NCCL communicators concurrently" warns of.

The kernels themselves live in :mod:`commrt.kernels._triton_kernels` (how a
table entry becomes a typed pointer, dtypes and rounding, mixed-dtype lists);
this module is the host side and the one the rest of the project imports.

Launch configuration
--------------------
On GPU each launch takes its ``BLOCK`` and warps from a fixed heuristic of
its size (:func:`commrt.kernels.configs.launch_config`), not from runtime
autotuning: no trial launches, no device synchronisation, no restores of
what a trial wrote, and at most two compilations per kernel and dtype. In
interpret mode one fixed config is used (the interpreter's cost is per block
step) so tests stay fast.
"""

from __future__ import annotations

import contextlib
import math
import operator
import threading
from collections import OrderedDict
from typing import List

import torch
import triton

from commrt.kernels._common import DTYPE_CODE, MIXED_CODE, check_overlap
from commrt.kernels._triton_kernels import _pack_kernel, _reduce_kernel, _unpack_kernel
from commrt.kernels.configs import launch_config
from commrt.kernels.lifetime import hold_until, is_default

# ----------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------

#: GPU chunk (elements per program) lies in [MIN_CHUNK, MAX_CHUNK]; it is
#: picked per call so that there are ~8 programs per SM when the bucket is big.
MIN_CHUNK = 4096
MAX_CHUNK = 65536
_PROGRAMS_PER_SM = 8

#: Interpret mode (CPU, tests): a single config. The interpreter's cost is
#: per block step (each nested @triton.jit call re-patches triton.language),
#: not per element, so blocks are large; 100 003 elements still span
#: several chunks. Tests shrink these knobs to put block and chunk edges at
#: 1024 and at a few elements.
INTERPRET_BLOCK = 4096
INTERPRET_CHUNK = 16384


def interpret_mode() -> bool:
    """True when Triton runs kernels in its interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(_pack_kernel, triton.runtime.JITFunction)


def check_device(device: torch.device) -> None:
    """Refuse devices the Triton path cannot serve (clear ValueError)."""
    if interpret_mode():
        if device.type != "cpu":
            raise ValueError(
                "TRITON_INTERPRET=1 is set: the interpreter copies kernel arguments to the host "
                "but cannot follow the device pointers in the pack/unpack tables; use CPU tensors "
                "or unset TRITON_INTERPRET"
            )
    elif device.type != "cuda":
        raise ValueError(
            f"impl='triton' needs CUDA tensors (got {device}); set TRITON_INTERPRET=1 before "
            "importing triton to run the kernels on CPU tensors, or use impl='torch'"
        )


# ----------------------------------------------------------------------------
# host side: tables, chunk size, launches
# ----------------------------------------------------------------------------


class _Tables:
    """Device-side table for one tensor list (see module docstring)."""

    __slots__ = (
        "addr",
        "flat_off",
        "numel",
        "code",
        "chunk_first",
        "chunk_owner",
        "n_chunks",
        "list_code",
        "aligned",
        "streams",
        "lo",
        "hi",
        "clear_of",
    )

    def columns(self) -> tuple:
        """The table's columns in the order both kernels take them: per tensor its address,
        flat offset, element count and dtype code, its first chunk; per chunk its owner."""
        return (self.addr, self.flat_off, self.numel, self.code, self.chunk_first, self.chunk_owner)

    def __init__(self, tensors: List[torch.Tensor], chunk: int, device: torch.device):
        addrs, offs, numels, codes, firsts, counts, ends = [], [], [], [], [], [], []
        off = 0
        n_chunks = 0
        aligned = True
        for t in tensors:
            n = t.numel()
            if n:
                addrs.append(t.data_ptr())
                ends.append(t.data_ptr() + n * t.element_size())
                offs.append(off)
                numels.append(n)
                codes.append(DTYPE_CODE[t.dtype])
                firsts.append(n_chunks)
                c = -(-n // chunk)
                counts.append(c)
                n_chunks += c
                aligned = aligned and t.data_ptr() % 16 == 0 and off % 8 == 0
            off += n
        k = len(addrs)
        per_tensor = torch.tensor(addrs + offs + numels + codes + firsts, dtype=torch.int64)
        owner = torch.repeat_interleave(
            torch.arange(k, dtype=torch.int64), torch.tensor(counts, dtype=torch.int64)
        )
        table = torch.cat([per_tensor, owner])
        if device.type == "cuda":  # one host-to-device copy, from pinned memory: no host wait
            table = table.pin_memory().to(device, non_blocking=True)
        per = table[: 5 * k].view(5, k)
        self.addr, self.flat_off, self.numel, self.code, self.chunk_first = per
        self.chunk_owner = table[5 * k :]
        self.n_chunks = n_chunks
        distinct = set(codes)
        self.list_code = distinct.pop() if len(distinct) == 1 else MIXED_CODE
        self.aligned = aligned
        # streams the table was recorded on (see _side_stream)
        self.streams: set[int] = set()
        # the bytes the tensors span, lowest address to highest end: a flat buffer outside
        # them cannot overlap any (checked per call in one comparison, _check_overlap)
        self.lo, self.hi = (min(addrs), max(ends)) if addrs else (0, 0)
        # flat buffers (address, dtype) that lie within those bytes and passed the
        # tensor-by-tensor overlap check: a list packed into the same buffer every step
        # pays for that check once
        self.clear_of: set = set()


_TABLE_CACHE: "OrderedDict[tuple, _Tables]" = OrderedDict()
_TABLE_CACHE_SIZE = 256
_lock = threading.Lock()


_DATA_PTR = torch.Tensor.data_ptr
_DTYPE = operator.attrgetter("dtype")


def _tables(tensors: List[torch.Tensor], sizes, chunk: int, device: torch.device) -> _Tables:
    """Tables for ``tensors`` (element counts ``sizes``), cached on (addresses, sizes,
    dtypes, chunk, device).

    GradientSync packs the same gradient tensors every step, so after the
    first step a launch costs no host-to-device copy. A cached table depends
    only on its key (addresses, not contents), so reusing it after an address
    was freed and handed to a new tensor of the same size is still correct.
    """
    key = (device, chunk, sizes, tuple(map(_DATA_PTR, tensors)), tuple(map(_DTYPE, tensors)))
    with _lock:
        tab = _TABLE_CACHE.get(key)
        if tab is not None:
            _TABLE_CACHE.move_to_end(key)
            return tab
    tab = _Tables(tensors, chunk, device)
    with _lock:
        _TABLE_CACHE[key] = tab
        while len(_TABLE_CACHE) > _TABLE_CACHE_SIZE:
            _TABLE_CACHE.popitem(last=False)
    return tab


_SM_COUNT = {}


def _chunk_for(total: int, device: torch.device) -> int:
    if interpret_mode():
        return INTERPRET_CHUNK
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    want = total / (_SM_COUNT[idx] * _PROGRAMS_PER_SM)
    chunk = 1 << max(0, math.ceil(math.log2(max(want, 1))))
    return min(MAX_CHUNK, max(MIN_CHUNK, chunk))


#: flat buffers remembered per table as checked (see _Tables.clear_of), at most
_CLEAR_OF_SIZE = 16


def _check_overlap(tab: _Tables, flat: torch.Tensor, tensors, total: int, what: str) -> None:
    """The list may not overlap ``flat`` except as its own slots (see
    :func:`commrt.kernels._common.check_overlap`); tensor by tensor only when ``flat`` lies
    within the bytes the cached table spans, and once per table and buffer."""
    lo = flat.data_ptr()
    if lo < tab.hi and tab.lo < lo + total * flat.element_size():
        seen = (lo, flat.dtype)
        if seen not in tab.clear_of:
            check_overlap(flat, tensors, what)
            if len(tab.clear_of) >= _CLEAR_OF_SIZE:
                tab.clear_of.clear()
            tab.clear_of.add(seen)


def _launch(kernel, grid, args, kwargs, numel: int, device):
    """Launch ``kernel`` over ``grid(block)`` programs (a tuple, as Triton takes it): in
    interpret mode with the fixed interpreter block, on GPU with the configuration of
    ``numel`` elements
    (:func:`commrt.kernels.configs.launch_config`)."""
    if interpret_mode():
        kernel[grid(INTERPRET_BLOCK)](*args, **kwargs, BLOCK=INTERPRET_BLOCK)
        return
    cfg = launch_config(numel)
    ctx = (
        contextlib.nullcontext()
        if device.type != "cuda" or device.index in (None, torch.cuda.current_device())
        else torch.cuda.device(device)
    )
    # enable_fp_fusion=False: no mul+add -> FMA contraction, so the GPU rounds
    # exactly like the interpreter the tests run (memory-bound: costs nothing).
    with ctx:
        kernel[grid(cfg.block)](
            *args, **kwargs, BLOCK=cfg.block, num_warps=cfg.num_warps, enable_fp_fusion=False
        )


def _side_stream(tab: _Tables, device: torch.device):
    """The current stream of CUDA ``device`` if it is not the device's default stream, else
    None (and None for other devices). The stream is asked for once per launch: the query
    is one of the costlier parts of a launch's host time.

    A cached table may be used from several streams, so the caching allocator is told of
    each (``record_stream``) lest it reuse the table while a kernel may still read it.
    Once per stream is enough: the allocator waits for every recorded stream when the
    (cached) table is freed; recording on every launch would add host time to each."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.current_stream(device)
    if stream.cuda_stream not in tab.streams:
        tab.chunk_owner.record_stream(stream)
        tab.streams.add(stream.cuda_stream)
    return None if is_default(stream, device) else stream


def _prepare(tensors, sizes, flat: torch.Tensor, total: int, what: str):
    """The host side pack and unpack share before their launch: (the cached table, the
    chunk, whether every address is 16-byte aligned, the side stream or None). Refuses
    an overlap of ``flat`` (named ``what``) with the list."""
    chunk = _chunk_for(total, flat.device)
    tab = _tables(tensors, sizes, chunk, flat.device)
    _check_overlap(tab, flat, tensors, total, what)
    aligned = tab.aligned and flat.data_ptr() % 16 == 0
    return tab, chunk, aligned, _side_stream(tab, flat.device)


def _after_launch(tensors, side) -> None:
    # The kernel reads the tensors through the table, which the allocator cannot see: on a
    # side stream they are held until it passes this launch (lifetime.hold_until); on the
    # default stream, where they were made, the allocator orders their reuse already.
    if side is not None:
        hold_until(side.record_event(), tensors)


def pack(tensors: List[torch.Tensor], sizes, out: torch.Tensor, scale: float, total: int) -> None:
    """Launch the pack kernel (inputs already validated; ``sizes``: their element counts).
    One launch for the whole list."""
    if total == 0:
        return
    tab, chunk, aligned, side = _prepare(tensors, sizes, out, total, "out")
    _launch(
        _pack_kernel,
        lambda block: (tab.n_chunks,),
        (*tab.columns(), out, float(scale), chunk),
        dict(SRC_CODE=tab.list_code, OUT_CODE=DTYPE_CODE[out.dtype], ALIGNED=aligned),
        total,
        out.device,
    )
    _after_launch(tensors, side)


def unpack(
    flat: torch.Tensor,
    tensors: List[torch.Tensor],
    sizes,
    scale: float,
    accumulate: bool,
    total: int,
) -> None:
    """Launch the unpack kernel (inputs already validated; ``sizes``: their element counts).
    One launch for the whole list."""
    if total == 0:
        return
    tab, chunk, aligned, side = _prepare(tensors, sizes, flat, total, "flat")
    _launch(
        _unpack_kernel,
        lambda block: (tab.n_chunks,),
        (flat, *tab.columns(), float(scale), chunk),
        dict(DST_CODE=tab.list_code, ACCUMULATE=bool(accumulate), ALIGNED=aligned),
        total,
        flat.device,
    )
    _after_launch(tensors, side)


def reduce_(dst: torch.Tensor, src: torch.Tensor, alpha: float, beta: float) -> None:
    """Launch the reduce kernel on 1-D contiguous ``dst``/``src`` (validated)."""
    n = dst.numel()
    if n == 0:
        return
    _launch(
        _reduce_kernel,
        lambda block: (triton.cdiv(n, block),),
        (dst, src, n, float(alpha), float(beta)),
        dict(DST_CODE=DTYPE_CODE[dst.dtype]),
        n,
        dst.device,
    )
