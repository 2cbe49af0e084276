"""reduce_: the executor's receive-reduce, ``dst = alpha * dst + beta * src``.

``src`` is typically a chunk just received in a narrower wire dtype (bf16 or
fp16) and ``dst`` the fp32 accumulator; any pair of supported dtypes works.
The sum is computed in fp32 and rounded once, to nearest even, to
``dst.dtype``. ``alpha = beta = 1`` is the all-reduce step; other weights are
the mixing step of gossip (e.g. ``alpha = beta = 0.5``).
"""

from __future__ import annotations

import torch

from commrt.kernels import _torch
from commrt.kernels._common import check_alias, check_dtype, parse_impl, triton_backend, use_triton
from commrt.kernels.pack import ImplLike


def _flat_view(t, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    check_dtype(t, what)
    if not t.is_contiguous():
        raise ValueError(
            f"{what} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})"
        )
    return t.view(-1)


def reduce_(
    dst: torch.Tensor,
    src: torch.Tensor,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    impl: ImplLike = "auto",
) -> torch.Tensor:
    """In place ``dst = round_to(dst.dtype, alpha * fp32(dst) + beta * fp32(src))``.

    Args:
        dst: contiguous fp32/fp16/bf16 tensor, updated in place.
        src: contiguous fp32/fp16/bf16 tensor with the same number of
            elements, on the same device (shapes may differ: both are read as
            1-D). It may be ``dst`` itself; any other overlap is refused.
        alpha, beta: weights, applied in fp32.
        impl: ``"auto"``, ``"triton"``, ``"torch"`` or an :class:`Impl`.

    Returns:
        ``dst``.

    Raises:
        ValueError: bad ``impl``, unsupported dtype, non-contiguous input,
            different element counts or devices, ``src`` overlapping ``dst`` in part.

    Example::

        >>> import torch
        >>> from commrt.kernels import reduce_
        >>> acc = torch.ones(3)
        >>> reduce_(acc, torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16), impl="torch").tolist()
        [2.0, 3.0, 4.0]
        >>> reduce_(acc, torch.zeros(3), alpha=0.5, beta=0.5, impl="torch").tolist()
        [1.0, 1.5, 2.0]
    """
    kind = parse_impl(impl)
    d = _flat_view(dst, "dst")
    s = _flat_view(src, "src")
    if d.numel() != s.numel():
        raise ValueError(f"dst has {d.numel()} elements but src has {s.numel()}")
    if d.device != s.device:
        raise ValueError(f"dst is on {d.device} but src is on {s.device}")
    check_alias(d, s)
    if use_triton(kind, d.device):
        triton_backend().reduce_(d, s, float(alpha), float(beta))
    else:
        _torch.reduce_(d, s, float(alpha), float(beta))
    return dst
