"""Triton kernels, the device side: fused pack (scale + cast), unpack (scale + cast [+ add]),
reduce.

The host side (pointer tables, chunk size, launches) is :mod:`commrt.kernels._triton`,
which imports this module and is the one the rest of the project uses; its
docstring explains how a list of tensors becomes one launch.

Inside a kernel, a table entry is turned back into a typed pointer with
``addr.to(tl.pointer_type(...))`` (int-to-pointer cast). On GPU that is a
plain ``inttoptr``. Under ``TRITON_INTERPRET=1`` (Triton 3.9) the interpreter
implements int<->pointer casts as a bitcast of the host address, and loads and
stores dereference raw host addresses, so the same tables work on CPU tensors:
the interpreter copies *kernel arguments* to the host (a no-op for CPU
tensors) but cannot know about addresses inside a table, which is why
interpret mode is restricted to CPU tensors (see ``_triton.check_device``).

Dtypes and rounding
-------------------
All arithmetic is fp32; results are rounded once to the destination dtype,
round-to-nearest-even. GPU launches pass ``enable_fp_fusion=False``, so
``a*x + b*y`` is not contracted into an FMA and the GPU rounds exactly as the
interpreter does in the tests. fp32->fp16 uses Triton's cast (``fptrunc``: RNE
on GPU, numpy RNE in the interpreter). fp32->bf16 uses :func:`_f32_to_bf16_rne`,
an integer implementation of RNE (the same bit trick as c10's
``round_to_nearest_even``), because Triton 3.9's interpreter *truncates*
fp32->bf16 casts, even with ``fp_downcast_rounding="rtne"``; using the same
integer code on GPU keeps what the tests check identical to what runs there
(a few integer ops per element in a memory-bound kernel).

A list that mixes source (pack) or destination (unpack) dtypes still takes
ONE launch: the dtype code travels in the table and the kernel branches on it
once per block (the branch is uniform across a program, so it does not
diverge). A list of one dtype -- the normal case -- compiles that dtype in as
a constexpr and has no branch at all.

Launch configurations (``BLOCK``, warps) come from a fixed size heuristic,
:func:`commrt.kernels.configs.launch_config`, not from autotuning.
"""

from __future__ import annotations

import triton
import triton.language as tl

from commrt.kernels._common import MIXED_CODE

_MIXED = tl.constexpr(MIXED_CODE)


# ----------------------------------------------------------------------------
# device-side helpers
# ----------------------------------------------------------------------------


@triton.jit
def _f32_to_bf16_rne(y):
    """Round fp32 ``y`` to bf16, nearest even (Inf stays Inf, NaN stays a quiet NaN)."""
    bits = y.to(tl.uint32, bitcast=True)
    # add 0x7FFF plus the lowest kept bit: ties go to the even neighbour
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    # a NaN payload could carry into the exponent: keep its top bits, force quiet
    quiet_nan = (bits >> 16) | 0x40
    out = tl.where(y != y, quiet_nan, rounded)
    return out.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _round_f32(y, CODE: tl.constexpr):
    """fp32 ``y`` rounded (nearest even) to the dtype with code CODE."""
    if CODE == 0:
        out = y
    elif CODE == 1:
        out = y.to(tl.float16)  # fptrunc: round to nearest even
    else:
        out = _f32_to_bf16_rne(y)
    return out


@triton.jit
def _typed_ptr(addr, CODE: tl.constexpr, ALIGNED: tl.constexpr):
    """Integer address ``addr`` as a pointer to the dtype with code CODE.

    ALIGNED: the host checked that the address is 16-byte aligned. The hint
    must sit on the pointer (a hint on the integer does not survive the
    int-to-pointer cast): it is what lets the GPU compiler emit 16-byte vector
    loads/stores (checked in the PTX for sm_90).
    """
    if CODE == 0:
        ptr = addr.to(tl.pointer_type(tl.float32))
    elif CODE == 1:
        ptr = addr.to(tl.pointer_type(tl.float16))
    else:
        ptr = addr.to(tl.pointer_type(tl.bfloat16))
    if ALIGNED:
        ptr = tl.multiple_of(ptr, 16)
    return ptr


@triton.jit
def _load_f32(addr, offs, mask, code, CODE: tl.constexpr, ALIGNED: tl.constexpr):
    """Load ``[addr + offs]`` widened to fp32.

    CODE: dtype code, or _MIXED to use runtime ``code``.
    """
    if CODE == _MIXED:
        if code == 0:
            x = tl.load(_typed_ptr(addr, 0, ALIGNED) + offs, mask=mask).to(tl.float32)
        elif code == 1:
            x = tl.load(_typed_ptr(addr, 1, ALIGNED) + offs, mask=mask).to(tl.float32)
        else:
            x = tl.load(_typed_ptr(addr, 2, ALIGNED) + offs, mask=mask).to(tl.float32)
    else:
        x = tl.load(_typed_ptr(addr, CODE, ALIGNED) + offs, mask=mask).to(tl.float32)
    return x


@triton.jit
def _store_f32(addr, offs, y, mask, code, CODE: tl.constexpr, ALIGNED: tl.constexpr):
    """Store fp32 ``y`` to ``[addr + offs]``, rounded to that tensor's dtype.

    CODE: dtype code, or _MIXED to use runtime ``code``.
    """
    if CODE == _MIXED:
        if code == 0:
            tl.store(_typed_ptr(addr, 0, ALIGNED) + offs, _round_f32(y, 0), mask=mask)
        elif code == 1:
            tl.store(_typed_ptr(addr, 1, ALIGNED) + offs, _round_f32(y, 1), mask=mask)
        else:
            tl.store(_typed_ptr(addr, 2, ALIGNED) + offs, _round_f32(y, 2), mask=mask)
    else:
        tl.store(_typed_ptr(addr, CODE, ALIGNED) + offs, _round_f32(y, CODE), mask=mask)


# ----------------------------------------------------------------------------
# pack
# ----------------------------------------------------------------------------


@triton.jit
def _pack_block(
    addr,
    code,
    out_t,
    offs,
    mask,
    scale,
    SRC_CODE: tl.constexpr,
    OUT_CODE: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    x = _load_f32(addr, offs, mask, code, SRC_CODE, ALIGNED)
    tl.store(out_t + offs, _round_f32(x * scale, OUT_CODE), mask=mask)


@triton.jit
def _pack_kernel(
    src_addr,  # *i64 [T]  data_ptr() of source tensor t
    flat_off,  # *i64 [T]  element offset of tensor t in `out`
    numel,  # *i64 [T]  element count of tensor t
    dtype_code,  # *i64 [T]  dtype code of tensor t (read only when SRC_CODE == MIXED)
    chunk_first,  # *i64 [T]  index of tensor t's first chunk
    chunk_owner,  # *i64 [C]  tensor owning chunk c; program c handles chunk c
    out,  # *T_out    flat buffer, written at [flat_off[t], flat_off[t] + numel[t])
    scale,  # f32       multiplier, applied in fp32 before the cast
    chunk,  # i32       elements per chunk (a multiple of BLOCK)
    SRC_CODE: tl.constexpr,  # dtype code of every source, or MIXED (per-tensor code from the table)
    OUT_CODE: tl.constexpr,  # dtype code of `out`
    ALIGNED: tl.constexpr,  # host checked: every source 16-byte aligned, every flat_off % 8 == 0
    BLOCK: tl.constexpr,  # elements per inner step
):
    pid = tl.program_id(0)
    t = tl.load(chunk_owner + pid)
    addr = tl.load(src_addr + t)
    base = tl.load(flat_off + t)
    n = tl.load(numel + t)
    code = tl.load(dtype_code + t)
    if ALIGNED:  # with the pointer hint in _typed_ptr: 16-byte vector loads and stores on GPU
        base = tl.multiple_of(base, 8)
    out_t = out + base  # this tensor's slot in the flat buffer
    start = (pid - tl.load(chunk_first + t)) * chunk  # int64: tensors may exceed 2**31 elements
    end = tl.minimum(start + chunk, n)
    n_full = (end - start) // BLOCK
    # full blocks: no mask, so loads and stores can be vectorized
    for i in range(0, n_full):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        _pack_block(addr, code, out_t, offs, None, scale, SRC_CODE, OUT_CODE, ALIGNED)
    # the tensor's ragged tail, if this chunk holds it
    tail = start + n_full * BLOCK
    if tail < end:
        offs = tail + tl.arange(0, BLOCK)
        _pack_block(addr, code, out_t, offs, offs < end, scale, SRC_CODE, OUT_CODE, ALIGNED)


# ----------------------------------------------------------------------------
# unpack
# ----------------------------------------------------------------------------


@triton.jit
def _unpack_block(
    flat_t,
    addr,
    code,
    offs,
    mask,
    scale,
    DST_CODE: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    y = tl.load(flat_t + offs, mask=mask).to(tl.float32) * scale
    if ACCUMULATE:
        y = _load_f32(addr, offs, mask, code, DST_CODE, ALIGNED) + y
    _store_f32(addr, offs, y, mask, code, DST_CODE, ALIGNED)


@triton.jit
def _unpack_kernel(
    flat,  # *T_flat   packed buffer, read at [flat_off[t], flat_off[t] + numel[t])
    dst_addr,  # *i64 [T]  data_ptr() of destination tensor t
    flat_off,  # *i64 [T]  element offset of tensor t in `flat`
    numel,  # *i64 [T]  element count of tensor t
    dtype_code,  # *i64 [T]  dtype code of tensor t (read only when DST_CODE == MIXED)
    chunk_first,  # *i64 [T]  index of tensor t's first chunk
    chunk_owner,  # *i64 [C]  tensor owning chunk c; program c handles chunk c
    scale,  # f32       multiplier, applied in fp32
    chunk,  # i32       elements per chunk (a multiple of BLOCK)
    DST_CODE: tl.constexpr,  # dtype code of every destination, or MIXED
    ACCUMULATE: tl.constexpr,  # True: dst = dst + scale * flat (fp32), else dst = scale * flat
    ALIGNED: tl.constexpr,  # host checked: every destination 16-byte aligned, flat_off % 8 == 0
    BLOCK: tl.constexpr,  # elements per inner step
):
    pid = tl.program_id(0)
    t = tl.load(chunk_owner + pid)
    addr = tl.load(dst_addr + t)
    base = tl.load(flat_off + t)
    n = tl.load(numel + t)
    code = tl.load(dtype_code + t)
    if ALIGNED:
        base = tl.multiple_of(base, 8)
    flat_t = flat + base
    start = (pid - tl.load(chunk_first + t)) * chunk
    end = tl.minimum(start + chunk, n)
    n_full = (end - start) // BLOCK
    for i in range(0, n_full):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        _unpack_block(flat_t, addr, code, offs, None, scale, DST_CODE, ACCUMULATE, ALIGNED)
    tail = start + n_full * BLOCK
    if tail < end:
        offs = tail + tl.arange(0, BLOCK)
        _unpack_block(flat_t, addr, code, offs, offs < end, scale, DST_CODE, ACCUMULATE, ALIGNED)


# ----------------------------------------------------------------------------
# reduce
# ----------------------------------------------------------------------------


@triton.jit
def _reduce_block(dst, src, offs, mask, alpha, beta, DST_CODE: tl.constexpr):
    d = tl.load(dst + offs, mask=mask).to(tl.float32)
    s = tl.load(src + offs, mask=mask).to(tl.float32)
    tl.store(dst + offs, _round_f32(alpha * d + beta * s, DST_CODE), mask=mask)


# ``n`` is not specialized (Triton would compile again for n == 1 and for n % 16 == 0):
# one compiled kernel per dtype, configuration and pointer alignment, whatever the size
@triton.jit(do_not_specialize=["n"])
def _reduce_kernel(
    dst,  # *T_dst  accumulator, updated in place
    src,  # *T_src  received chunk, same element count (may be a narrower wire dtype)
    n,  # i64/i32 element count
    alpha,  # f32     weight of dst
    beta,  # f32     weight of src
    DST_CODE: tl.constexpr,  # dtype code of dst (chooses the rounding)
    BLOCK: tl.constexpr,  # elements per program
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if (pid.to(tl.int64) + 1) * BLOCK <= n:  # full block: unmasked, vectorizable
        _reduce_block(dst, src, offs, None, alpha, beta, DST_CODE)
    else:
        _reduce_block(dst, src, offs, offs < n, alpha, beta, DST_CODE)
