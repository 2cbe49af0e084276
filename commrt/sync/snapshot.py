"""A snapshot of training state: parameters and every optimizer state tensor, bit for bit.

One ``uint8`` buffer holds the parameters, then the optimizer's state
tensors (in parameter order, each parameter's keys sorted), each at a
multiple of 8 bytes (:func:`commrt.collectives.coalesce.byte_layout`). The *layout*,
a JSON-able dict, says what the buffer holds, so that a rank that has
never stepped (no optimizer state yet) can load it; non-tensor state
(a step count kept as a number) travels in the layout itself. Nothing here
is specific to backup workers: the catch-up moves the buffer, any other
transfer could.

Example::

    >>> flat, layout = pack_snapshot(params, optimizer)            # doctest: +SKIP
    >>> load_snapshot(flat, layout, other_params, other_optimizer)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from commrt.collectives.coalesce import byte_layout, byte_views
from commrt.errors import CommError

#: every tensor of a snapshot starts at a multiple of this many bytes
ALIGN = 8
#: bytes per message when a snapshot travels (:func:`pieces`)
PIECE_BYTES = 64 << 20


def pieces(flat: torch.Tensor) -> list[torch.Tensor]:
    """``flat`` cut into messages of at most :data:`PIECE_BYTES`."""
    return [flat[i : i + PIECE_BYTES] for i in range(0, flat.numel(), PIECE_BYTES)] or [flat]


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise CommError(f"commrt: catch-up snapshot names an unknown dtype {name!r}")
    return dt


def _specs(params, tensors) -> list[tuple[torch.dtype, list[int]]]:
    """(dtype, shape) of every tensor of the snapshot, in buffer order."""
    return [(p.dtype, list(p.shape)) for p in params] + [
        (_dtype(d), list(shape)) for _, _, d, shape, _ in tensors
    ]


def snapshot_layout(params: list[torch.Tensor], optimizer) -> dict:
    """What a snapshot of ``params`` and ``optimizer``'s state holds, in order (JSON-able)."""
    tensors, values = [], []
    for j, p in enumerate(params):
        st = optimizer.state.get(p, {}) if optimizer is not None else {}
        for key in sorted(st, key=str):
            v = st[key]
            if torch.is_tensor(v):
                tensors.append([j, str(key), str(v.dtype), list(v.shape), v.device.type == "cpu"])
            else:
                values.append([j, str(key), v])
    _, total = byte_layout(_specs(params, tensors), ALIGN)
    return {
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "tensors": tensors,
        "values": values,
        "nbytes": total,
    }


def _views(flat: torch.Tensor, params, layout):
    """(destination description, view of ``flat``) for every tensor of the snapshot."""
    where = [("param", p) for p in params] + [
        ("state", j, key, cpu) for j, key, _, _, cpu in layout["tensors"]
    ]
    return list(zip(where, byte_views(flat, _specs(params, layout["tensors"]), ALIGN), strict=True))


def pack_snapshot(params, optimizer, flat: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Copy parameters and optimizer state into one flat byte buffer; return it and its layout."""
    layout = snapshot_layout(params, optimizer)
    if flat is None or flat.numel() != layout["nbytes"]:
        flat = torch.empty(layout["nbytes"], dtype=torch.uint8, device=params[0].device)
    with torch.no_grad():
        for (kind, *where), view in _views(flat, params, layout):
            if kind == "param":
                view.copy_(where[0].detach())
            else:
                j, key, _ = where
                view.copy_(optimizer.state[params[j]][_key(optimizer.state[params[j]], key)])
    return flat, layout


def load_snapshot(flat: torch.Tensor, layout: dict, params, optimizer) -> None:
    """Overwrite ``params`` and ``optimizer``'s state with a snapshot, bit for bit."""
    if optimizer is not None and layout["optimizer"] not in (None, type(optimizer).__name__):
        raise ValueError(
            f"commrt: the catch-up snapshot comes from a {layout['optimizer']} but "
            f"this rank steps a {type(optimizer).__name__}: every rank must use the "
            f"same optimizer"
        )
    with torch.no_grad():
        for (kind, *where), view in _views(flat, params, layout):
            if kind == "param":
                where[0].copy_(view)
            elif optimizer is not None:
                j, key, cpu = where
                st = optimizer.state[params[j]]
                k = _key(st, key)
                cur = st.get(k)
                if torch.is_tensor(cur) and cur.shape == view.shape and cur.dtype == view.dtype:
                    cur.copy_(view)
                else:
                    st[k] = view.to("cpu" if cpu else params[j].device, copy=True)
        if optimizer is not None:
            for j, key, v in layout["values"]:
                st = optimizer.state[params[j]]
                st[_key(st, key)] = v


def _key(state: dict, key: str):
    # state keys are strings for every torch optimizer; keep a non-string key's identity
    for k in state:
        if str(k) == key:
            return k
    return key
