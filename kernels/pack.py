"""pack / unpack: a list of tensors <-> one flat bucket, with scale and cast fused.

Tensor ``i`` of the list lives in the flat buffer at
``[off_i, off_i + numel_i)`` with ``off_i = numel_0 + ... + numel_{i-1}``
(dense, in list order). Scaling and the dtype cast happen in the same pass:
``fp32(x) * fp32(scale)``, rounded once, to nearest even, to the destination
dtype.

Launch count (Triton path): ONE kernel launch per call, whatever the number
of tensors, their sizes or their dtypes -- a list that mixes dtypes carries a
per-tensor dtype code in the pointer table (see :mod:`commrt.kernels._triton`).

The tensors may have any shape but must be contiguous. In place is allowed in
one form only: tensor ``i`` may BE its own slot of the flat buffer (same
address, same dtype), as when a bucket is scaled where it lies
(``pack([flat], flat, scale=1 / p)``); every element is then read before it
is written, by the same program. Any other overlap between the flat buffer
and a tensor is refused with a ValueError (it would read elements already
overwritten). The Triton path tests this against its cached table of the
list, so the common case costs one comparison per call.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

from commrt.kernels import _torch
from commrt.kernels._common import (
    Impl,
    check_capacity,
    check_flat,
    check_list,
    check_overlap,
    parse_impl,
    triton_backend,
    use_triton,
)

ImplLike = Union[str, Impl]


def _checked(impl: ImplLike, flat: torch.Tensor, what: str, tensors: Sequence[torch.Tensor]):
    """The checks pack and unpack share: (use Triton?, tensors, their sizes, total elements)."""
    kind = parse_impl(impl)
    check_flat(flat, what)
    tensors, sizes = check_list(tensors, flat.device, "tensors")
    total = sum(sizes)
    check_capacity(flat, total, what)
    return use_triton(kind, flat.device), tensors, sizes, total


def pack(
    tensors: Sequence[torch.Tensor], out: torch.Tensor, scale: float = 1.0, impl: ImplLike = "auto"
) -> torch.Tensor:
    """Copy ``tensors`` into the flat buffer ``out``, scaled and cast to ``out.dtype``.

    ``out[off_i : off_i + n_i] = round_to(out.dtype, fp32(tensors[i]).flatten() * scale)``;
    elements of ``out`` past the total are left untouched.

    Args:
        tensors: contiguous fp32/fp16/bf16 tensors of any shapes (dtypes may
            differ), on ``out``'s device. Empty list and zero-size tensors are fine.
        out: 1-D contiguous fp32/fp16/bf16 buffer with at least ``sum(numel)`` elements.
        scale: multiplier applied in fp32 before the cast (e.g. ``1 / world_size``).
        impl: ``"auto"`` (Triton for CUDA tensors, torch for CPU tensors),
            ``"triton"``, ``"torch"``, or an :class:`Impl`.

    Returns:
        ``out``.

    Raises:
        ValueError: bad ``impl``, unsupported dtype, non-contiguous tensor,
            device mismatch, ``out`` too small, or a tensor overlapping ``out``
            other than as its own slot (see the module docs).

    Example::

        >>> import torch
        >>> from commrt.kernels import pack
        >>> grads = [torch.ones(2, 2), torch.full((3,), 2.0)]
        >>> bucket = torch.empty(7, dtype=torch.bfloat16)
        >>> pack(grads, bucket, scale=0.5, impl="torch").tolist()
        [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0]
    """
    triton, tensors, sizes, total = _checked(impl, out, "out", tensors)
    scale = float(scale)
    if triton:
        triton_backend().pack(tensors, sizes, out, scale, total)  # checks overlap on its table
    else:
        check_overlap(out, tensors, "out")
        _torch.pack(tensors, out, scale, sizes)
    return out


def unpack(
    flat: torch.Tensor,
    tensors: Sequence[torch.Tensor],
    scale: float = 1.0,
    accumulate: bool = False,
    impl: ImplLike = "auto",
) -> None:
    """Copy (or add) slices of the flat buffer ``flat`` back into ``tensors``.

    For every i, with ``x = fp32(flat[off_i : off_i + n_i]) * scale`` (fp32):

    * ``accumulate=False``: ``tensors[i] = round_to(tensors[i].dtype, x)``
    * ``accumulate=True``:  ``tensors[i] = round_to(tensors[i].dtype, fp32(tensors[i]) + x)``

    Args:
        flat: 1-D contiguous fp32/fp16/bf16 buffer with at least ``sum(numel)`` elements.
        tensors: contiguous fp32/fp16/bf16 destinations of any shapes (dtypes
            may differ), on ``flat``'s device, written in place.
        scale: multiplier applied in fp32.
        accumulate: add into the destinations instead of overwriting them.
        impl: ``"auto"``, ``"triton"``, ``"torch"`` or an :class:`Impl`.

    Raises:
        ValueError: as :func:`pack`.

    Example::

        >>> import torch
        >>> from commrt.kernels import unpack
        >>> a, b = torch.zeros(2), torch.ones(1, dtype=torch.float16)
        >>> unpack(torch.tensor([1.0, 2.0, 3.0]), [a, b], scale=2.0, accumulate=True, impl="torch")
        >>> a.tolist(), b.tolist()
        ([2.0, 4.0], [7.0])
    """
    triton, tensors, sizes, total = _checked(impl, flat, "flat", tensors)
    scale = float(scale)
    if triton:
        triton_backend().unpack(flat, tensors, sizes, scale, bool(accumulate), total)
    else:
        check_overlap(flat, tensors, "flat")
        _torch.unpack(flat, tensors, scale, bool(accumulate), sizes)
