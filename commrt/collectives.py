"""Collectives on whole tensors: :func:`all_reduce`."""
from __future__ import annotations

import enum

import torch

from commrt.algorithms import DEFAULT_ALGORITHM, Algorithm, resolve
from commrt.comm import Communicator

#: dtypes :func:`all_reduce` accepts (integers with ``op="sum"`` only)
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"

    @classmethod
    def parse(cls, op: "str | ReduceOp") -> "ReduceOp":
        if isinstance(op, cls):
            return op
        try:
            return cls(str(op).lower())
        except ValueError:
            raise ValueError(f"unknown op {op!r}; choose 'sum' or 'avg'") from None


def check_tensor(tensor: torch.Tensor, comm: Communicator, op: ReduceOp) -> None:
    """Raise ValueError/TypeError for tensors commrt cannot reduce, saying why."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {tensor.dtype}; commrt reduces "
                         f"{', '.join(str(d).replace('torch.', '') for d in SUPPORTED_DTYPES)}")
    if op is ReduceOp.AVG and not tensor.dtype.is_floating_point:
        raise ValueError(f"op='avg' needs a floating-point tensor, got {tensor.dtype}; use op='sum'")
    if tensor.device.type != comm.device.type:
        hint = " (move it with .to(comm.device))"
        raise ValueError(f"tensor is on {tensor.device} but the {comm.backend.value} communicator "
                         f"works on {comm.device}{hint}")


def all_reduce(tensor: torch.Tensor, comm: Communicator, algorithm: "str | Algorithm" = DEFAULT_ALGORITHM,
               op: "str | ReduceOp" = "avg", *, timeout: float | None = None, tracer=None) -> torch.Tensor:
    """Reduce ``tensor`` across all ranks of ``comm``, in place; returns it.

    ``algorithm`` is a name (``"ring"``, ``"halving_doubling"``, ...) or an
    instance carrying options. ``op`` is ``"sum"`` or ``"avg"``. Any shape
    works; a non-contiguous tensor is reduced through a contiguous copy that
    is written back (so it still works in place, at the cost of two copies).

    Example::

        >>> t = torch.full((1000,), float(comm.rank))          # doctest: +SKIP
        >>> commrt.all_reduce(t, comm, algorithm="ring", op="sum")
    """
    op = ReduceOp.parse(op)
    alg = resolve(algorithm)
    check_tensor(tensor, comm, op)
    comm._check_open()
    if comm._active_sync is not None:
        # Its buckets are mid-sequence on the wire; interleaving another
        # collective would pair this rank's messages with a peer's buckets.
        raise RuntimeError("commrt: a GradientSync step is in flight on this communicator; call "
                           "sync.wait() before other collectives (or use a second communicator)")
    if comm._syncs:
        comm._settle()
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = work.view(-1)
    if comm.world_size > 1 and flat.numel() > 0:
        with comm.lock:
            schedule = alg.select(comm.world_size, flat.numel() * flat.element_size(), comm)
            comm.executor.run(schedule, flat, comm.transport,
                              timeout=comm.timeout if timeout is None else timeout,
                              piece_bytes=comm.piece_bytes, average=op is ReduceOp.AVG, tracer=tracer,
                              owner=work)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def gather_rows(comm: Communicator, row, dtype: torch.dtype = torch.float64) -> list[list]:
    """Every rank's ``row`` (same length everywhere), on every rank, in rank order.

    One sum all-reduce of a p-row table in which each rank fills only its
    own row: exact (each slot adds one value to zeros), identical on every
    rank, and it cannot deadlock on a mismatch the way differently sized
    messages could. Collective: every rank calls it.
    """
    row = list(row)
    table = torch.zeros(comm.world_size, len(row), dtype=dtype, device=comm.device)
    table[comm.rank] = torch.tensor(row, dtype=dtype)
    all_reduce(table, comm, algorithm="ring", op="sum")
    return table.cpu().tolist()
