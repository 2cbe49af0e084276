"""Fused pack / unpack / reduce kernels: Triton on CUDA, torch reference on CPU.

Every gradient bucket passes through these three operations:

* :func:`pack` -- copy a list of tensors into one flat buffer, scaled and cast
  to the wire dtype, in ONE kernel launch (driven by a table of pointers,
  offsets and element counts);
* :func:`unpack` -- the reverse, casting back to each tensor's dtype and
  optionally adding into it;
* :func:`reduce_` -- the receive-reduce ``dst = alpha * dst + beta * src``,
  with ``src`` possibly in a narrower wire dtype.

Dtypes: fp32, fp16 and bf16 (:data:`SUPPORTED_DTYPES`) in every combination.
Math is fp32; each result is rounded once, to nearest even, to its
destination dtype.

``impl`` (:class:`Impl`): ``"auto"`` runs the Triton kernels on CUDA tensors
and the torch reference on CPU tensors; ``"triton"`` / ``"torch"`` force a
path. The Triton kernels also run on CPU tensors when ``TRITON_INTERPRET=1``
was set before Triton was imported (that is how the tests run them).

The modules: :mod:`~commrt.kernels.pack` (``pack``, ``unpack``) and
:mod:`~commrt.kernels.reduce` (``reduce_``), the public entry points;
:mod:`~commrt.kernels._common` (dtypes, the ``impl`` switch, input checks);
:mod:`~commrt.kernels._torch` (the torch reference path);
:mod:`~commrt.kernels._triton` (the Triton path's host side: pointer tables and
launches) and :mod:`~commrt.kernels._triton_kernels` (its device side);
:mod:`~commrt.kernels.configs` (the launch configurations, a fixed heuristic of the
element count) and :mod:`~commrt.kernels.lifetime` (keeping tensors alive while
another stream still uses them).

Example::

    >>> import torch
    >>> from commrt.kernels import pack, unpack, reduce_
    >>> grads = [torch.randn(3, 4), torch.randn(5)]
    >>> bucket = torch.empty(17, dtype=torch.bfloat16)
    >>> _ = pack(grads, bucket, scale=0.25)          # bucket = bf16(grads / 4)
    >>> _ = reduce_(bucket, bucket.clone())            # "receive" and add a peer's copy
    >>> unpack(bucket, grads)                          # grads = fp32(bucket)
"""

from commrt.kernels._common import SUPPORTED_DTYPES, Impl
from commrt.kernels.pack import pack, unpack
from commrt.kernels.reduce import reduce_

__all__ = ["pack", "unpack", "reduce_", "Impl", "SUPPORTED_DTYPES"]
