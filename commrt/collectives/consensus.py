"""Consensus: bring drifting models back to one exact average.

Gossip (and any local-update scheme) lets the ranks' parameters drift
apart. :func:`average_parameters` replaces every rank's parameters (and,
if given, the optimizer's state tensors) by their mean over all ranks and
reports how far apart the ranks were.
"""

from __future__ import annotations

import math

import torch

from commrt.collectives.coalesce import coalesced
from commrt.collectives.core import all_reduce, gather_rows
from commrt.errors import api_boundary
from commrt.transports.base import average_factor

#: float64 elements averaged per all-reduce (bounds the temporary copy: 64 MiB)
GROUP_ELEMS = 8 << 20


def _state_tensors(model: torch.nn.Module, optimizer) -> list[torch.Tensor]:
    """The optimizer's floating-point state tensors of the model's parameters, in a fixed order."""
    if optimizer is None:
        return []
    out = []
    for p in model.parameters():
        state = optimizer.state.get(p, {})
        for key in sorted(state, key=str):
            v = state[key]
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                out.append(v)
    return out


@api_boundary
def average_parameters(
    model: torch.nn.Module, comm, optimizer: torch.optim.Optimizer | None = None
) -> float:
    """Average ``model``'s parameters over all ranks, in place; return the disagreement.

    Collective: every rank calls it with the same model structure. The sum
    runs in float64 through :func:`commrt.all_reduce` (whose schedules end
    with one copy of each sum on every rank), so afterwards every rank holds
    bit-identical parameters: the float64 mean rounded once to the
    parameter's dtype. With ``optimizer`` its floating-point state tensors
    (momentum, Adam's moments, ...) are averaged the same way.

    Returns the disagreement measured *before* averaging, max over ranks of
    ‖θ_r − θ̄‖ / ‖θ̄‖ over all parameters (0.0 when the ranks agree or p = 1),
    the same value on every rank. It is also stored in
    ``sync.stats.disagreement`` of every open :class:`~commrt.GradientSync`
    of this model on ``comm``. Models or optimizer states of different
    sizes raise ValueError on every rank, before any data moves.

    Example::

        >>> model = torch.nn.Linear(4, 2)
        >>> d = commrt.average_parameters(model, comm)
        >>> print(f"ranks were {d:.2e} apart; now identical")   # doctest: +ELLIPSIS
        ranks were ... apart; now identical
    """
    params = [p for p in model.parameters()]
    state = _state_tensors(model, optimizer)
    if comm.world_size == 1:
        return 0.0
    counts = [
        len(params),
        sum(p.numel() for p in params),
        len(state),
        sum(s.numel() for s in state),
    ]
    rows = gather_rows(comm, counts, torch.int64)
    if any(r != rows[0] for r in rows):
        raise ValueError(
            "commrt.average_parameters: ranks pass different models or optimizer states "
            "(tensors, elements, state tensors, state elements): "
            + "; ".join(f"rank {r}: {row}" for r, row in enumerate(rows))
        )
    model_tensors = {id(t) for t in params}
    num = den = 0.0
    p = comm.world_size
    with torch.no_grad():
        for group in coalesced(params + state, max_bytes=GROUP_ELEMS * 8, wire=torch.float64):
            group.flat.mul_(average_factor(p))  # the rule: scaled before the sum
            all_reduce(group.flat, comm, op="sum")
            for t, mean in group.views():
                if id(t) in model_tensors:  # the disagreement is about the model, not its state
                    num += float((t.detach().to(torch.float64) - mean).square().sum())
                    den += float(mean.square().sum())
                t.copy_(mean)
    mine = math.sqrt(num) / math.sqrt(den) if den > 0 else (0.0 if num == 0 else math.inf)
    worst = max(row[0] for row in gather_rows(comm, [mine], torch.float64))
    for sync in comm.syncs.open():
        if sync.model is model:
            sync.stats.disagreement = worst
    return worst
