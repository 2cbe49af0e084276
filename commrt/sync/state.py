"""Model state across ranks: start every rank from the same weights.

:func:`broadcast_state` copies rank 0's parameters and buffers to every
rank in a few large broadcasts (one per dtype, in groups of at most
:data:`GROUP_BYTES`), so a model of thousands of small tensors costs a
handful of messages, not thousands.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from commrt.collectives import SUPPORTED_DTYPES, broadcast

#: largest flat buffer one broadcast carries (bounds the temporary copy)
GROUP_BYTES = 64 << 20
# dtypes commrt moves as they are; others (bool, uint8, int8, int16, ...) travel as int64
_AS_IS = set(SUPPORTED_DTYPES)


def broadcast_state(model: torch.nn.Module, comm, root: int = 0, *, parameters: bool = True,
                    buffers: bool = True) -> int:
    """Overwrite ``model``'s parameters and buffers on every rank with ``root``'s.

    Collective: every rank calls it with the same model structure (its
    tensors in the same order, with the same shapes and dtypes). Returns the
    number of bytes broadcast. :class:`~commrt.GradientSync` calls it at
    construction.

    Example::

        >>> from commrt.sync.state import broadcast_state
        >>> broadcast_state(model, comm)       # doctest: +SKIP
    """
    tensors = []
    if parameters:
        tensors += [p for p in model.parameters()]
    if buffers:
        tensors += [b for b in model.buffers()]
    if comm.world_size == 1 or not tensors:
        return 0
    groups: dict[torch.dtype, list[list[torch.Tensor]]] = defaultdict(lambda: [[]])
    for t in tensors:
        wire = t.dtype if t.dtype in _AS_IS else torch.int64
        group = groups[wire]
        if group[-1] and sum(x.numel() for x in group[-1]) * wire.itemsize + t.numel() * wire.itemsize > GROUP_BYTES:
            group.append([])
        group[-1].append(t)
    sent = 0
    with torch.no_grad():
        for wire in sorted(groups, key=str):   # the same order on every rank
            for group in groups[wire]:
                flat = torch.cat([t.detach().reshape(-1).to(wire) for t in group])
                broadcast(flat, comm, root=root)
                sent += flat.numel() * flat.element_size()
                offset = 0
                for t in group:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
    return sent
