"""Collectives on whole tensors: :func:`all_reduce` and :func:`broadcast`.

With ``COMMRT_DEBUG=1`` in the environment (or ``commrt.init(debug=True)``)
every collective first checks, in one small exchange of fixed size, that all
ranks make the same call (kind, shape, dtype, op, algorithm, root); a
mismatch raises :class:`~commrt.errors.CollectiveMismatchError` on every rank,
naming what each side called, instead of a truncated message on one rank
and a timeout on the other. It costs one extra latency-bound exchange per
call: a debugging aid, as ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` is for torch.
"""
from __future__ import annotations

import enum

import torch

from commrt.algorithms import DEFAULT_ALGORITHM, Algorithm, resolve
from commrt.algorithms import broadcast as _bcast
from commrt.comm import Communicator
from commrt.errors import CollectiveMismatchError
from commrt.schedule import Collective

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


# the usual spellings, looked up without the enum machinery (all_reduce's hot path)
_OPS = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG,
        ReduceOp.SUM: ReduceOp.SUM, ReduceOp.AVG: ReduceOp.AVG}


def check_tensor(tensor: torch.Tensor, comm: Communicator, op: ReduceOp) -> None:
    """Raise ValueError/TypeError for tensors commrt cannot reduce, saying why."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.requires_grad:
        raise ValueError("the tensor requires grad: commrt collectives work in place, which autograd "
                         "does not allow on such a tensor; pass tensor.detach() (or call under "
                         "torch.no_grad()) to reduce its values")
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
    parsed = _OPS.get(op) if isinstance(op, (str, ReduceOp)) else None
    op = parsed if parsed is not None else ReduceOp.parse(op)
    alg = resolve(algorithm)
    check_tensor(tensor, comm, op)
    _enter(comm)
    if comm.debug:
        _agree(comm, _Call("all_reduce", tuple(tensor.shape), tensor.dtype, op.value, alg.name))
    return _run(tensor, comm, alg.select, op is ReduceOp.AVG, timeout, tracer)


def broadcast(tensor: torch.Tensor, comm: Communicator, root: int = 0, *,
              algorithm: Algorithm | None = None, timeout: float | None = None, tracer=None) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with rank ``root``'s, in place; returns it.

    A binomial tree for small buffers and a pipelined chain for large ones
    (:func:`commrt.algorithms.broadcast.choose`), or the broadcast
    ``algorithm`` given (:class:`~commrt.algorithms.BinomialTree`,
    :class:`~commrt.algorithms.PipelinedChain`). Every rank passes a tensor
    of the same shape and dtype.

    Example::

        >>> w = torch.randn(1000) if comm.rank == 0 else torch.empty(1000)   # doctest: +SKIP
        >>> commrt.broadcast(w, comm, root=0)        # now every rank holds rank 0's w
    """
    check_tensor(tensor, comm, ReduceOp.SUM)
    if not isinstance(root, int) or not 0 <= root < comm.world_size:
        raise ValueError(f"root must be a rank in 0..{comm.world_size - 1}, got {root!r}")
    if algorithm is not None and not (isinstance(algorithm, Algorithm) and algorithm.supports(
            Collective.BROADCAST)):
        raise ValueError(f"{algorithm!r} is not a broadcast algorithm; use commrt.algorithms.BinomialTree() "
                         f"or PipelinedChain()")
    _enter(comm)
    if comm.debug:
        _agree(comm, _Call("broadcast", tuple(tensor.shape), tensor.dtype, f"root{root}",
                           algorithm.name if algorithm is not None else "auto"))

    def pick(world_size: int, nbytes: int, comm: Communicator):
        alg = algorithm if algorithm is not None else _bcast.choose(world_size, nbytes)
        return alg.schedule(world_size, root=root)
    return _run(tensor, comm, pick, False, timeout, tracer)


def _enter(comm: Communicator) -> None:
    """What every collective checks before it touches the wire."""
    comm._check_open()
    if comm._active_sync is not None:
        # Its buckets are mid-sequence on the wire; interleaving another
        # collective would pair this rank's messages with a peer's buckets.
        raise RuntimeError("commrt: a GradientSync step is in flight on this communicator; call "
                           "sync.wait() before other collectives (or use a second communicator)")
    if comm._syncs:
        comm._settle()


def _run(tensor: torch.Tensor, comm: Communicator, pick, average: bool, timeout, tracer) -> torch.Tensor:
    """Run ``pick(world_size, nbytes, comm)``'s schedule in place on ``tensor`` (through a
    contiguous copy if needed)."""
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    numel = work.numel()
    if comm.world_size > 1 and numel > 0:
        with comm.lock:
            schedule = pick(comm.world_size, numel * work.element_size(), comm)
            comm.executor.run(schedule, work, comm.transport,
                              timeout=comm.timeout if timeout is None else timeout,
                              piece_bytes=comm.piece_bytes, average=average, tracer=tracer,
                              owner=work, spin_s=comm.spin_s)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


class _Call:
    """One rank's description of a collective call, as a fixed-length row of numbers."""

    MAX_DIMS, MAX_TEXT = 8, 24
    KINDS = ("all_reduce", "broadcast")

    def __init__(self, kind: str, shape: tuple, dtype: torch.dtype, op: str, algorithm: str):
        self.kind, self.shape, self.dtype, self.op, self.algorithm = kind, shape, dtype, op, algorithm

    def row(self) -> list[float]:
        dims = list(self.shape[:self.MAX_DIMS]) + [-1] * (self.MAX_DIMS - min(len(self.shape), self.MAX_DIMS))
        return ([self.KINDS.index(self.kind), len(self.shape), SUPPORTED_DTYPES.index(self.dtype)] + dims
                + _text(self.op, self.MAX_TEXT) + _text(self.algorithm, self.MAX_TEXT))

    @classmethod
    def from_row(cls, row) -> "_Call":
        v = [int(x) for x in row]
        n, d = cls.MAX_DIMS, cls.MAX_TEXT
        shape = tuple(v[3:3 + min(v[1], n)])
        return cls(cls.KINDS[v[0]], shape, SUPPORTED_DTYPES[v[2]], _untext(v[3 + n:3 + n + d]),
                   _untext(v[3 + n + d:]))

    def __str__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"{self.kind}(shape={list(self.shape)}, {dtype}, {self.op}, algorithm={self.algorithm})"


def _text(s: str, n: int) -> list[int]:
    b = s.encode()[:n]
    return list(b) + [0] * (n - len(b))


def _untext(codes) -> str:
    return bytes(c for c in codes if c).decode(errors="replace")


def _agree(comm: Communicator, call: _Call) -> None:
    """Debug mode: raise on every rank unless every rank makes the same ``call``."""
    rows = _gather(comm, call.row(), torch.float64)
    if all(r == rows[0] for r in rows):
        return
    calls = [_Call.from_row(r) for r in rows]
    mine = calls[comm.rank]
    other = next(r for r, c in enumerate(calls) if rows[r] != rows[comm.rank])
    groups: dict[str, list[int]] = {}
    for r, c in enumerate(calls):
        groups.setdefault(str(c), []).append(r)
    sides = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {c}" for c, rs in groups.items())
    raise CollectiveMismatchError(f"commrt (COMMRT_DEBUG): rank {comm.rank} called {mine} but rank {other} "
                                  f"called {calls[other]}" + (f". All calls: {sides}" if len(groups) > 2 or
                                                              comm.world_size > 2 else ""))


def gather_rows(comm: Communicator, row, dtype: torch.dtype = torch.float64) -> list[list]:
    """Every rank's ``row`` (same length everywhere), on every rank, in rank order.

    One sum all-reduce of a p-row table in which each rank fills only its
    own row: exact (each slot adds one value to zeros), identical on every
    rank, and it cannot deadlock on a mismatch the way differently sized
    messages could. Collective: every rank calls it.
    """
    _enter(comm)
    return _gather(comm, row, dtype)


def _gather(comm: Communicator, row, dtype: torch.dtype) -> list[list]:
    row = list(row)
    table = torch.zeros(comm.world_size, len(row), dtype=dtype, device=comm.device)
    table[comm.rank] = torch.tensor(row, dtype=dtype)
    _run(table, comm, resolve("ring").select, False, None, None)
    return table.cpu().tolist()
