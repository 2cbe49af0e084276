"""Collectives on whole tensors: :func:`all_reduce` and :func:`broadcast`.

The first time each call signature (kind, shape, dtype, op, algorithm, root)
is used on a communicator, all ranks check, in one small exchange of fixed
size, that they make the same call; a mismatch raises
:class:`~commrt.errors.CollectiveMismatchError` on every rank, naming what
each side called, on any backend (instead of a truncated message on one rank,
an abort inside gloo, or silently wrong math for equal sizes in different
shapes). Agreed signatures are remembered on the communicator
(``comm.slots.agreed_calls``), so a repeated call costs one set lookup, and
an all-reduce that repeats the last settled call
(:class:`~commrt.collectives.memo.SettledCall`) not even that.

With ``COMMRT_DEBUG=1`` in the environment (or ``commrt.init(debug=True)``)
every call is checked, which also catches a rank making a call it made
before while another makes a new one. It costs one extra latency-bound
exchange per call: a debugging aid, as ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` is
for torch.
"""

from __future__ import annotations

import math
import time
import zlib

import torch

from commrt import settings
from commrt.algorithms import DEFAULT_ALGORITHM, Algorithm, resolve
from commrt.algorithms import broadcast as _bcast
from commrt.collectives.memo import SettledCall, average_scale, counted
from commrt.collectives.reductions import (
    COMMRT,
    NAMED_DTYPES,
    REDUCERS,
    SPELLINGS,
    SUPPORTED_DTYPES,
    DtypeRules,
    ReduceOp,
)
from commrt.errors import CollectiveMismatchError, CommError, CommTimeoutError, api_boundary
from commrt.process.rendezvous import check_timeout
from commrt.runtime import rows as _rows
from commrt.runtime.communicator import Communicator
from commrt.schedule import Collective, tags
from commrt.schedule.p2p import Exchange, Where, engine_error
from commrt.schedule.position import CallCheck
from commrt.tuning.hook_comm import HookComm

__all__ = ["all_reduce", "broadcast", "agree_call", "gather_rows", "check_tensor", "dtype_rules"]
__all__ += ["use_dtype_rules"]
__all__ += ["ReduceOp", "SUPPORTED_DTYPES"]  # defined in commrt.collectives.reductions

#: per op, the dtypes a plain CPU tensor may have to pass :func:`check_tensor` in a few
#: attribute reads (commrt's own rules, which every other set of rules widens)
_QUICK = COMMRT.dtypes


def check_tensor(
    tensor: torch.Tensor, comm: Communicator, op: ReduceOp, moves_only: bool = False
) -> None:
    """Raise ValueError/TypeError for tensors commrt cannot reduce with ``op`` on ``comm``
    (its dtype rules: :func:`dtype_rules`), saying why. ``moves_only``: the collective only
    moves bytes (broadcast, all-gather): any dtype."""
    # the common case first, in as few attribute reads as possible: a plain CPU tensor, on
    # a CPU communicator, of a dtype any collective takes for this op
    if (
        type(tensor) is torch.Tensor
        and tensor.is_cpu
        and comm.device_type == "cpu"
        and not tensor.requires_grad
        and tensor.dtype in _QUICK[op]
    ):
        return
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.requires_grad:
        raise ValueError(
            "the tensor requires grad: commrt collectives work in place, which autograd "
            "does not allow on such a tensor; pass tensor.detach() (or call under "
            "torch.no_grad()) to reduce its values"
        )
    if not moves_only:
        dtype_rules(comm).check(tensor.dtype, op)
    if tensor.device.type != comm.device_type:
        hint = " (move it with .to(comm.device))"
        raise ValueError(
            f"tensor is on {tensor.device} but the {comm.backend.value} communicator "
            f"works on {comm.device}{hint}"
        )


def dtype_rules(comm: Communicator) -> DtypeRules:
    """The dtypes each op reduces on ``comm`` (:mod:`commrt.collectives.reductions`):
    commrt's own, or those its owner set (a torch.distributed group's: gloo's)."""
    rules = comm.slots.dtype_rules
    return COMMRT if rules is None else rules


def use_dtype_rules(comm: Communicator, rules: DtypeRules) -> None:
    """Make ``rules`` the dtypes each op reduces on ``comm`` from now on (its owner's
    contract: a torch.distributed group's communicator takes gloo's and NCCL's)."""
    if not isinstance(rules, DtypeRules):
        raise TypeError(f"expected DtypeRules, got {type(rules).__name__}")
    comm.slots.dtype_rules = rules


@api_boundary
def all_reduce(
    tensor: torch.Tensor,
    comm: Communicator,
    algorithm: "str | Algorithm" = DEFAULT_ALGORITHM,
    op: "str | ReduceOp" = "avg",
    *,
    timeout: float | None = None,
    tracer=None,
) -> torch.Tensor:
    """Average ``tensor`` across all ranks of ``comm`` (``op="sum"`` sums, as torch's does).

    In place; returns it. The default averages, unlike ``torch.distributed.all_reduce``,
    because averaging gradients is what data parallelism asks of it (GradientSync, the
    hooks and ``average_parameters`` all average), and a changed default would quietly
    change what existing programs compute. ``dist.all_reduce`` on the ``"commrt"``
    backend sums, as on any backend.

    ``algorithm`` is a name (``"ring"``, ``"halving_doubling"``, ...) or an
    instance carrying options. ``op``: ``"sum"``, ``"avg"``, ``"min"``,
    ``"max"``, ``"prod"`` or the bitwise ``"band"``, ``"bor"``, ``"bxor"`` (or a
    :class:`~commrt.collectives.reductions.ReduceOp`); the dtypes each takes are
    listed in :mod:`commrt.collectives.reductions`. Any shape works; a
    non-contiguous tensor is reduced through a contiguous copy that is written
    back (so it still works in place, at the cost of two copies).

    Example::

        >>> t = torch.full((1000,), float(comm.rank + 1))
        >>> commrt.all_reduce(t, comm, algorithm="ring", op="sum") is t   # in place
        True
        >>> t[0].item() == comm.world_size * (comm.world_size + 1) / 2
        True
        >>> t = commrt.all_reduce(t, comm, op="max")
    """
    # One path for every all-reduce, commrt's and the torch backend's: find the call's
    # settled schedule, admit the call, scale an average, run it. A repeat of the last call
    # on the same tensor (same algorithm and op objects, dtype, shape: the executor's memo of
    # the last call) is found by identity tests alone; any other call is parsed, resolved,
    # checked, then looked up by signature (_by_signature); one not kept yet takes the full
    # way (_first_call): the cross-rank check on first use, select, run, observe.
    if timeout is not None:  # refused before an average scales the tensor, not after
        check_timeout(timeout)
    run = comm.executor.last
    last = None if run is None else run.call
    if (
        last is not None
        and last.algorithm is algorithm
        and last.op is op
        and type(tensor) is torch.Tensor
        and tensor.data_ptr() == run.data_ptr
        and tensor.dtype is last.dtype
        and tensor.shape == last.shape
        and not tensor.requires_grad
        and tensor.is_contiguous()
    ):
        comm.admit_collective()
        started = time.perf_counter() if last.timed else 0.0  # as _run times the full path
        if last.scale is not None:
            tensor.mul_(last.scale)
        comm.repeat(run, tensor, timeout, tracer)
        if last.counter is not None:
            counted(comm, last, started)
        return tensor
    return _by_signature(tensor, comm, algorithm, op, timeout, tracer)


def _by_signature(tensor, comm, algorithm, op, timeout, tracer) -> torch.Tensor:
    """:func:`all_reduce` of a call that is not a repeat of the last: parsed, resolved,
    checked, then run as its signature's settled call, or the full way (:func:`_first_call`)."""
    parsed = SPELLINGS.get(op) if isinstance(op, (str, ReduceOp)) else None
    parsed = parsed if parsed is not None else ReduceOp.parse(op)
    alg = resolve(algorithm)
    check_tensor(tensor, comm, parsed)
    known = (alg, parsed, tensor.dtype, tensor.shape)
    settled = comm.executor.settled.get(known)  # none kept under debug (_first_call)
    comm.admit_collective()
    if settled is None:
        return _first_call(tensor, comm, algorithm, op, parsed, alg, known, timeout, tracer)
    if settled.algorithm is not algorithm or settled.op is not op:  # another spelling
        settled = comm.executor.settled.keep(settled.spelled(algorithm, op))
    started = time.perf_counter() if settled.timed else 0.0
    if settled.scale is not None:
        tensor.mul_(settled.scale)
    # by position: a repeated small call pays for every keyword argument
    comm.run_schedule(
        settled.schedule, tensor, timeout, settled.reduce, tracer, tensor, call=settled
    )
    if settled.counter is not None:
        counted(comm, settled, started)
    return tensor


#: an all-reduce op as its ``agreed_calls`` key names it: whether it averages, for sum and
#: avg; its name for the others, as :func:`agree_call` spells ops
_AGREED_AS = {op: op.value for op in ReduceOp} | {ReduceOp.SUM: False, ReduceOp.AVG: True}


def _first_call(tensor, comm, algorithm, op, parsed, alg, known, timeout, tracer):
    """:func:`all_reduce` for a signature not settled: agree on it across ranks (once per
    signature), select, run and observe; remember the schedule while the algorithm's select
    gives it on the next calls (settled, or a phase of ``auto``'s learning that runs it)."""
    key = ("all_reduce", tensor.shape, tensor.dtype, _AGREED_AS[parsed], alg.name)
    if key not in comm.slots.agreed_calls:
        _agree(comm, _Call("all_reduce", tensor.shape, tensor.dtype, parsed.value, alg.name), key)
    context = HookComm(comm)  # what select and observe may ask of the communicator
    observe = alg.observe if alg.learns else None
    scale, reduce = average_scale(parsed, comm.world_size), REDUCERS.get(parsed)
    ran = _run(tensor, comm, alg.select, timeout, tracer, observe, context, scale, reduce)
    # under debug nothing is kept: every call comes back here, to be checked again
    memo = comm.executor.settled
    if ran is None or comm.debug or not memo.keeps(known, alg.learns, ran[1]):
        return tensor
    # what select chose for this call is kept: a fixed algorithm's on its first call; one
    # that learns, on the call after one whose observe said the next calls run it again
    timer, p = alg.phase_timer(context, ran[2]), comm.world_size
    counter = timer if timer is not None else alg.settled_counter(context, ran[2])
    memo.keep(
        SettledCall(algorithm, op, parsed, tensor, ran[0], known, counter, p, timer is not None)
    )
    return tensor


@api_boundary
def broadcast(
    tensor: torch.Tensor,
    comm: Communicator,
    root: int = 0,
    *,
    algorithm: Algorithm | None = None,
    timeout: float | None = None,
    tracer=None,
) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with rank ``root``'s, in place; returns it.

    A binomial tree for small buffers and a pipelined chain for large ones
    (:func:`commrt.algorithms.broadcast.choose`), or the broadcast
    ``algorithm`` given (:class:`~commrt.algorithms.BinomialTree`,
    :class:`~commrt.algorithms.PipelinedChain`). Every rank passes a tensor
    of the same shape and dtype.

    Example::

        >>> w = torch.randn(1000) if comm.rank == 0 else torch.empty(1000)
        >>> w = commrt.broadcast(w, comm, root=0)    # now every rank holds rank 0's w
    """
    check_tensor(tensor, comm, ReduceOp.SUM, moves_only=True)
    if not isinstance(root, int) or not 0 <= root < comm.world_size:
        raise ValueError(f"root must be a rank in 0..{comm.world_size - 1}, got {root!r}")
    if algorithm is not None and not (
        isinstance(algorithm, Algorithm) and algorithm.supports(Collective.BROADCAST)
    ):
        raise ValueError(
            f"{algorithm!r} is not a broadcast algorithm; use commrt.algorithms.BinomialTree() "
            f"or PipelinedChain()"
        )
    comm.admit_collective()
    name = algorithm.name if algorithm is not None else "auto"
    key = ("broadcast", tensor.shape, tensor.dtype, root, name)
    if key not in comm.slots.agreed_calls:
        _agree(comm, _Call("broadcast", tensor.shape, tensor.dtype, f"root{root}", name), key)

    def pick(world_size: int, nbytes: int, comm: Communicator):
        alg = algorithm if algorithm is not None else _bcast.choose(world_size, nbytes)
        return alg.schedule(world_size, root=root)

    _run(tensor, comm, pick, timeout, tracer)
    return tensor


def agree_call(
    comm: Communicator, kind: str, shape: tuple, dtype: torch.dtype, op: str, algorithm: str
) -> None:
    """The cross-rank call check (see the module docs) for collectives defined elsewhere
    (:mod:`commrt.collectives.shards`, :mod:`commrt.distributed`): raises
    :class:`~commrt.errors.CollectiveMismatchError` on every rank unless all make this call.
    ``kind`` is one of ``_Call.KINDS`` ("other" for the process group's remaining calls)."""
    key = (kind, tuple(shape), dtype, op, algorithm)
    if key not in comm.slots.agreed_calls:
        _agree(comm, _Call(kind, tuple(shape), dtype, op, algorithm), key)


def _run(
    tensor: torch.Tensor,
    comm: Communicator,
    pick,
    timeout,
    tracer,
    observe=None,
    context: HookComm | None = None,
    scale: float | None = None,
    reduce=None,
) -> tuple | None:
    """Run ``pick(world_size, nbytes, context)``'s schedule in place on ``tensor``
    (:meth:`~commrt.Communicator.run_held`), scaled first by ``scale`` (an average's 1/p;
    None: not scaled) and reducing as ``reduce`` says; then ``observe(context, nbytes,
    started)`` (``auto`` learns from its own timings: commrt.algorithms.auto_learn).
    ``context``: the communicator as the algorithm's hooks see it (default: ``comm``
    itself). Returns ``(schedule, settled, nbytes)`` (``settled``: what observe
    returned), or None where nothing was sent."""
    nbytes = tensor.nbytes
    if comm.world_size == 1 or not nbytes:
        return None
    # the lock once, around all three: pick may probe the network (a collective) on first use
    with comm.lock:
        context = comm if context is None else context
        schedule = pick(comm.world_size, nbytes, context)
        started = time.perf_counter()
        if scale is not None:
            tensor.mul_(scale)
        comm.run_held(schedule, tensor, timeout, reduce, tracer, tensor)
        settled = observe is None or observe(context, nbytes, started)
    return (schedule, settled, nbytes)


#: dtypes a call description can name (SUPPORTED_DTYPES first: their codes stay put)
_DTYPES = NAMED_DTYPES


class _Call:
    """One rank's description of a collective call, as a row of numbers whose length
    does not depend on the call (so the exchange that compares rows has the same size
    on every rank, whatever each called): the first ``MAX_DIMS`` dimensions, the
    element count and a CRC of the whole shape; op and algorithm as text (cut at
    ``MAX_TEXT`` bytes) and a CRC of both in full. Every value is an integer below
    2**53, exact in float64."""

    MAX_DIMS, MAX_TEXT = 8, 24
    KINDS = ("all_reduce", "broadcast", "gather_rows", "reduce_scatter", "all_gather", "other")
    HEAD = 6  # kind, ndim, dtype, numel, shape CRC, text CRC

    def __init__(self, kind: str, shape: tuple, dtype: torch.dtype, op: str, algorithm: str):
        self.kind, self.shape, self.dtype, self.op, self.algorithm = (
            kind,
            tuple(shape),
            dtype,
            op,
            algorithm,
        )
        self.ndim, self.numel = len(self.shape), math.prod(self.shape)

    def row(self) -> list[int]:
        n = self.MAX_DIMS
        dims = list(self.shape[:n]) + [-1] * (n - min(self.ndim, n))
        dtype = _DTYPES.index(self.dtype) if self.dtype in _DTYPES else len(_DTYPES)
        return (
            [
                self.KINDS.index(self.kind),
                self.ndim,
                dtype,
                self.numel,
                zlib.crc32(repr(self.shape).encode()),
                zlib.crc32(f"{self.op}|{self.algorithm}|{self.dtype}".encode()),
            ]
            + dims
            + _text(self.op, self.MAX_TEXT)
            + _text(self.algorithm, self.MAX_TEXT)
        )

    @classmethod
    def from_row(cls, row) -> "_Call":
        v = [int(x) for x in row]
        n, d, h = cls.MAX_DIMS, cls.MAX_TEXT, cls.HEAD
        kind, ndim, dtype, numel = v[0], v[1], v[2], v[3]
        call = cls(
            cls.KINDS[kind],
            tuple(v[h : h + min(ndim, n)]),
            _DTYPES[dtype] if dtype < len(_DTYPES) else "another dtype",
            _untext(v[h + n : h + n + d]),
            _untext(v[h + n + d :]),
        )
        call.ndim, call.numel = ndim, numel
        return call

    def __str__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        shape = ", ".join(map(str, self.shape)) + (", ..." if self.ndim > self.MAX_DIMS else "")
        return f"{self.kind}(shape=[{shape}], {dtype}, {self.op}, algorithm={self.algorithm})"


def _text(s: str, n: int) -> list[int]:
    b = s.encode()[:n]
    return list(b) + [0] * (n - len(b))


def _untext(codes) -> str:
    return bytes(c for c in codes if c).decode(errors="replace")


def _agree(comm: Communicator, call: _Call, key) -> None:
    """Raise on every rank unless every rank makes the same ``call``; else remember
    ``key`` (the caller's cheap form of ``call``) as agreed on ``comm``, unless
    ``comm.debug``: then nothing is remembered, so that every call is checked."""
    pos, done = comm.executor.position, False
    pos.check(CallCheck(call.kind, call.algorithm, call.numel, str(call.dtype)))
    try:  # the stall watch sees this rank in the call, waiting on every rank
        rows = _exchange_rows(comm, call.row(), call.algorithm)
        done = True
    finally:
        pos.end(done)
    if all(r == rows[0] for r in rows):
        if not comm.debug:
            comm.slots.agreed_calls.add(key)
        return
    calls = [_Call.from_row(r) for r in rows]
    mine = calls[comm.rank]
    other = next(r for r, c in enumerate(calls) if rows[r] != rows[comm.rank])
    groups: dict[str, list[int]] = {}
    for r, c in enumerate(calls):
        groups.setdefault(str(c), []).append(r)
    sides = "; ".join(
        f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {c}"
        for c, rs in groups.items()
    )
    sizes = len({c.numel for c in calls}) > 1
    how = (
        settings.DEBUG.name
        if comm.debug
        else "checked on a call signature's first use; COMMRT_DEBUG=1 checks every call"
    )
    raise CollectiveMismatchError(
        f"commrt: rank {comm.rank} called {mine} but rank {other} called {calls[other]}"
        + (f". All calls: {sides}" if len(groups) > 2 or comm.world_size > 2 else "")
        + (
            ": the ranks called collectives of different sizes"
            if sizes
            else ": same number of elements, different calls"
        )
        + f" ({how})"
    )


#: said beside a timeout in the call check (a note: the error itself reads as step 0's)
CHECK_NOTE = (
    "commrt: this wait was the check that all ranks make the same call, run the "
    "first time a call signature is used: the peer never came to this call, or it "
    "is repeating an earlier call while this rank makes a new one (COMMRT_DEBUG=1 "
    "checks every call and names such a mismatch)"
)


def _exchange_rows(comm: Communicator, row: list[int], algorithm: str) -> list[list[int]]:
    """Every rank's call row, on every rank: each rank sends its row to every other
    in one group under its own tag. Every message has the same size, so ranks that
    disagree still complete it; it stays out of the executor (no plan, no binding,
    so the data calls' caches see only the data calls). A peer that never comes
    times out as step 0 of ``algorithm`` would (the call went no further)."""
    mine = torch.tensor(row, dtype=torch.float64, device=comm.device)
    if comm.world_size == 1:
        return [row]
    peers = [r for r in range(comm.world_size) if r != comm.rank]
    got = {r: torch.empty_like(mine) for r in peers}
    where = Where(algorithm, step=0)
    try:
        Exchange(
            comm,
            sends=[(mine, r) for r in peers],
            recvs=[(got[r], r) for r in peers],
            tag=tags.CALL_CHECK,
            where=where,
            hold_lock=True,
        ).complete()
    except CommTimeoutError as e:
        e.add_note(CHECK_NOTE)
        comm.verdict_at_timeout(e)
        raise
    except CommError:
        raise
    except RuntimeError as e:  # engine errors (a peer's connection closed, ...), as the executor
        error = engine_error(comm.transport, e, peers, where)
        comm.failed_in_call(error)
        raise error from e
    return [row if r == comm.rank else got[r].cpu().tolist() for r in range(comm.world_size)]


def gather_rows(comm: Communicator, row, dtype: torch.dtype = torch.float64) -> list[list]:
    """Every rank's ``row`` (same length everywhere), on every rank, in rank order.

    One sum all-reduce of a p-row table in which each rank fills only its
    own row: exact (each slot adds one value to zeros), identical on every
    rank, and it cannot deadlock on a mismatch the way differently sized
    messages could. Collective: every rank calls it. Rows of different lengths
    raise :class:`~commrt.errors.CollectiveMismatchError` on every rank (checked
    the first time each length is used, as :func:`all_reduce` checks its calls).
    """

    def agree(length: int) -> None:
        key = ("gather_rows", length, dtype)
        if key not in comm.slots.agreed_calls:
            _agree(comm, _Call("gather_rows", (length,), dtype, "", "rows"), key)

    return _rows.gather(comm, row, dtype, agree)
