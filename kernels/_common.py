"""Shared pieces of the kernels layer: dtypes, the ``impl`` switch, input checks.

Nothing here launches work; :mod:`commrt.kernels.pack` and
:mod:`commrt.kernels.reduce` call these checks first, then hand the validated
inputs to the torch reference (:mod:`commrt.kernels._torch`) or to the Triton
kernels (:mod:`commrt.kernels._triton`, imported only when first needed so
that ``commrt.kernels`` works on machines without Triton).
"""

from __future__ import annotations

import enum
import importlib
from typing import Sequence, Tuple

import torch

#: Dtypes every kernel accepts, as source, destination and wire dtype, in any
#: combination.
SUPPORTED_DTYPES: Tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)

#: Small integer code per dtype; the Triton kernels branch on these.
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: Code meaning "each tensor of the list carries its own dtype code".
MIXED_CODE = 3


class Impl(str, enum.Enum):
    """Which implementation runs a kernel.

    ``AUTO`` picks Triton for CUDA tensors and the torch reference for CPU
    tensors; ``TRITON`` and ``TORCH`` force one path (tests use both).
    """

    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"


def parse_impl(impl) -> Impl:
    """Return ``impl`` as an :class:`Impl`; ValueError naming the choices otherwise."""
    if isinstance(impl, Impl):
        return impl
    if isinstance(impl, str):
        try:
            return Impl(impl.lower())
        except ValueError:
            pass
    choices = ", ".join(repr(i.value) for i in Impl)
    raise ValueError(f"impl must be one of {choices} (or a commrt.kernels.Impl), got {impl!r}")


def _dtype_names() -> str:
    return ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)


def check_dtype(t: torch.Tensor, what: str) -> None:
    if t.dtype not in DTYPE_CODE:
        raise ValueError(
            f"{what} has dtype {str(t.dtype).replace('torch.', '')}; supported dtypes are {_dtype_names()}"
        )


def check_flat(t, what: str) -> None:
    """``t`` must be a 1-D contiguous tensor of a supported dtype."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    check_dtype(t, what)
    if t.dim() != 1 or not t.is_contiguous():
        raise ValueError(
            f"{what} must be a 1-D contiguous tensor, got shape {tuple(t.shape)} with strides {t.stride()}"
        )


def check_list(tensors, device: torch.device, what: str) -> Tuple[list, Tuple[int, ...]]:
    """Check a pack/unpack tensor list; return it as a list and its element counts.

    Every entry must be a contiguous tensor (any shape) of a supported dtype on
    ``device``. Non-contiguous tensors are refused rather than silently copied:
    a copy would break unpack (it would write into the copy) and would cost the
    peak memory this layer exists to avoid. (This runs on every call, so it is
    written for speed: it is a visible share of the cost of a small bucket.)
    """
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence):
        raise ValueError(f"{what} must be a list or tuple of tensors, got {type(tensors).__name__}")
    out = list(tensors)
    sizes = []
    for i, t in enumerate(out):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what}[{i}] must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPE_CODE:
            check_dtype(t, f"{what}[{i}]")
        if t.device != device:
            raise ValueError(f"{what}[{i}] is on {t.device} but the flat buffer is on {device}")
        if not t.is_contiguous():
            raise ValueError(
                f"{what}[{i}] (shape {tuple(t.shape)}, strides {t.stride()}) is not contiguous; "
                "pass a contiguous tensor (e.g. .contiguous(), then copy back yourself)"
            )
        sizes.append(t.numel())
    return out, tuple(sizes)


def check_overlap(flat: torch.Tensor, tensors: Sequence[torch.Tensor], what: str) -> None:
    """Refuse a tensor of the list whose memory overlaps the part of ``flat`` the call uses,
    unless it is exactly its own slot (same address, same dtype as ``flat``).

    In place is allowed in that one form because every element is then read and written
    by the same program of one pass, before any other element is touched; any other overlap
    would read elements another program has already overwritten (or, across dtypes, half
    of one). Costs one address comparison per tensor.
    """
    size = flat.element_size()
    lo = flat.data_ptr()
    hi = lo + sum(t.numel() for t in tensors) * size
    off = 0
    for i, t in enumerate(tensors):
        n = t.numel()
        p = t.data_ptr()
        if n and p < hi and p + n * t.element_size() > lo:
            if p != lo + off * size or t.dtype != flat.dtype:
                raise ValueError(
                    f"tensors[{i}] overlaps {what}, the flat buffer, other than as its own "
                    f"slot {what}[{off}:{off + n}]: pack and unpack work in place only where "
                    f"each tensor IS its slot, with the buffer's dtype; copy it first (to "
                    f"scale a buffer in place, Tensor.mul_)"
                )
        off += n


def check_alias(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``src`` may be ``dst`` itself (same address and dtype) or apart from it, never
    overlapping it in part: elements would be read after another program wrote them."""
    d, s = dst.data_ptr(), src.data_ptr()
    if d == s and dst.dtype == src.dtype:
        return
    if s < d + dst.numel() * dst.element_size() and d < s + src.numel() * src.element_size():
        raise ValueError(
            "src overlaps dst in part: reduce_ reads src while it writes dst, so src must be "
            "dst itself or apart from it; copy src first"
        )


def check_capacity(flat: torch.Tensor, total: int, what: str) -> None:
    if flat.numel() < total:
        raise ValueError(
            f"{what} holds {flat.numel()} elements but the tensors need {total} "
            f"({total - flat.numel()} more)"
        )


_TRITON_MODULE = None
_TRITON_ERROR = None


def triton_backend():
    """Import :mod:`commrt.kernels._triton` on first use; None if Triton is missing."""
    global _TRITON_MODULE, _TRITON_ERROR
    if _TRITON_MODULE is None and _TRITON_ERROR is None:
        try:
            _TRITON_MODULE = importlib.import_module("commrt.kernels._triton")
        except ImportError as e:  # triton not installed: the torch path still works
            _TRITON_ERROR = e
    return _TRITON_MODULE


def use_triton(impl: Impl, device: torch.device) -> bool:
    """Resolve ``impl`` for tensors on ``device``: True means launch Triton.

    AUTO: Triton for CUDA tensors (torch reference if Triton is not installed,
    or runs in interpreter mode), torch reference for everything else. TRITON: needs CUDA tensors, or CPU
    tensors with ``TRITON_INTERPRET=1`` set before Triton was imported.
    """
    if impl is Impl.TORCH:
        return False
    if impl is Impl.AUTO:
        # Under TRITON_INTERPRET=1 the kernels cannot serve CUDA tensors (see
        # _triton.check_device): auto then falls back to the torch path.
        if device.type != "cuda":
            return False
        backend = triton_backend()
        return backend is not None and not backend.interpret_mode()
    backend = triton_backend()
    if backend is None:
        raise RuntimeError(
            f"impl='triton' needs the triton package, which failed to import: {_TRITON_ERROR}"
        )
    backend.check_device(device)
    return True
