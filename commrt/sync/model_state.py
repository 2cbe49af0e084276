"""Model state across ranks: start every rank from the same weights.

:func:`broadcast_state` copies rank 0's parameters and buffers to every
rank in a few large broadcasts (one per dtype, in groups of at most
:data:`GROUP_BYTES`), so a model of thousands of small tensors costs a
handful of messages, not thousands.
"""

from __future__ import annotations

import torch

from commrt.collectives.coalesce import coalesced
from commrt.collectives.core import SUPPORTED_DTYPES, broadcast

#: largest flat buffer one broadcast carries (bounds the temporary copy)
GROUP_BYTES = 64 << 20
# dtypes commrt moves as they are; others (bool, uint8, int8, int16, ...) travel as int64
_AS_IS = set(SUPPORTED_DTYPES)


def broadcast_state(
    model: torch.nn.Module, comm, root: int = 0, *, parameters: bool = True, buffers: bool = True
) -> int:
    """Overwrite ``model``'s parameters and buffers on every rank with ``root``'s.

    Collective: every rank calls it with the same model structure (its
    tensors in the same order, with the same shapes and dtypes). Returns the
    number of bytes broadcast. :class:`~commrt.GradientSync` calls it at
    construction.

    Example::

        >>> from commrt.sync.model_state import broadcast_state
        >>> broadcast_state(model, comm)       # doctest: +SKIP
    """
    tensors = []
    if parameters:
        tensors += [p for p in model.parameters()]
    if buffers:
        tensors += [b for b in model.buffers()]
    if comm.world_size == 1 or not tensors:
        return 0
    sent = 0
    for group in coalesced(tensors, max_bytes=GROUP_BYTES, wire=_wire):
        broadcast(group.flat, comm, root=root)
        sent += group.flat.numel() * group.flat.element_size()
        group.copy_back()
    return sent


def _wire(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in _AS_IS else torch.int64
