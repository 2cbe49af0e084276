"""Reduce-scatter and all-gather: collectives over one shard per rank.

``commrt.reduce_scatter(out, inp, comm)`` leaves on rank r the sum (or
average) of every rank's ``r``-th shard of ``inp`` (``inp`` holds
``world_size`` shards of ``out``'s size, in rank order), and
``commrt.all_gather(out, inp, comm)`` puts rank r's ``inp`` into shard r
of every rank's ``out``: the semantics of torch.distributed's
``reduce_scatter_tensor`` and ``all_gather_into_tensor``, which FSDP is
built on. Both run a schedule (``ring``, ``halving_doubling`` for a
power-of-two p, ``torus2d``) that the symbolic checker proves and the
simulator prices like any other.

A schedule names which rank ends with (reduce-scatter) or starts from
(all-gather) each chunk (``Schedule.owners``); the shards are laid out in
that order in a work buffer, so every algorithm serves the rank-order
semantics. The average is the pack kernel's scale (``1/p`` applied while
the shards are copied in), not a pass of its own.

Example::

    >>> out = torch.empty(1000)
    >>> out = commrt.reduce_scatter(out, torch.ones(1000 * comm.world_size), comm, op="avg")
    >>> full = commrt.all_gather(torch.empty(1000 * comm.world_size), out, comm)
"""

from __future__ import annotations

import torch

from commrt.algorithms import Algorithm, resolve
from commrt.collectives.core import ReduceOp, agree_call, check_tensor
from commrt.collectives.memo import average_scale
from commrt.errors import api_boundary
from commrt.kernels import SUPPORTED_DTYPES as PACK_DTYPES
from commrt.kernels import pack
from commrt.runtime.communicator import Communicator
from commrt.schedule import Collective, Schedule

__all__ = ["reduce_scatter", "all_gather", "shard_schedule"]


def shard_schedule(alg: Algorithm, world_size: int, collective: Collective) -> Schedule:
    """``alg``'s schedule for ``collective`` with one chunk per rank, or a ValueError
    that names the algorithm and what to use instead."""
    if not alg.supports(collective):
        raise ValueError(
            f"algorithm {alg.name} has no {collective.value} schedule; use ring, "
            f"halving_doubling (p a power of two) or torus2d"
        )
    sched = alg.schedule(world_size, collective=collective)
    if sched.num_chunks != world_size or sorted(sched.owners) != list(range(world_size)):
        raise ValueError(
            f"{alg.name}'s {collective.value} schedule for {world_size} ranks does not give "
            "one chunk to each rank; use ring"
        )
    return sched


def _shards(t: torch.Tensor, p: int) -> list[torch.Tensor]:
    return list(t.reshape(-1).chunk(p)) if t.numel() else [t.reshape(-1)] * p


def _check_sizes(out: torch.Tensor, inp: torch.Tensor, p: int, what: str) -> None:
    big, small = (inp, out) if what == "reduce_scatter" else (out, inp)
    if big.numel() != small.numel() * p:
        raise ValueError(
            f"commrt.{what}: the {'input' if what == 'reduce_scatter' else 'output'} must hold "
            f"world_size ({p}) × {small.numel()} elements, got {big.numel()}"
        )
    if out.dtype != inp.dtype:
        raise ValueError(f"commrt.{what}: output is {out.dtype} but input is {inp.dtype}")
    if not out.is_contiguous():
        raise ValueError(f"commrt.{what}: the output must be contiguous")


@api_boundary
def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    comm: Communicator,
    algorithm: "str | Algorithm" = "ring",
    op: "str | ReduceOp" = "sum",
    *,
    timeout: float | None = None,
) -> torch.Tensor:
    """Rank r's ``output`` = the sum (``op="avg"``: average) over ranks of shard r of
    ``input``; returns ``output``. ``input`` is left as it was."""
    op = ReduceOp.parse(op)
    if op is not ReduceOp.SUM and op is not ReduceOp.AVG:
        raise ValueError(f"commrt.reduce_scatter: op must be 'sum' or 'avg', got {op.value!r}")
    alg = resolve(algorithm)
    check_tensor(input, comm, op)
    check_tensor(output, comm, op)
    p = comm.world_size
    _check_sizes(output, input, p, "reduce_scatter")
    comm.admit_collective()
    agree_call(comm, "reduce_scatter", input.shape, input.dtype, op.value, alg.name)
    if p == 1:
        output.view(-1).copy_(input.reshape(-1))
        return output
    sched = shard_schedule(alg, p, Collective.REDUCE_SCATTER)
    shards = _shards(input, p)
    work = torch.empty(input.numel(), dtype=input.dtype, device=input.device)
    scale = average_scale(op, p) or 1.0
    ordered = [shards[o] for o in sched.owners]  # chunk c ends on owners[c]: its shard goes there
    if input.dtype in PACK_DTYPES:
        pack([s.contiguous() for s in ordered], work, scale=scale)
    else:
        torch.cat(ordered, out=work)
        if scale != 1.0:
            work.mul_(scale)
    _execute(comm, sched, work, timeout)
    mine = sched.owners.index(comm.rank)
    output.view(-1).copy_(_shards(work, p)[mine])
    return output


@api_boundary
def all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    comm: Communicator,
    algorithm: "str | Algorithm" = "ring",
    *,
    timeout: float | None = None,
) -> torch.Tensor:
    """Shard r of every rank's ``output`` = rank r's ``input``; returns ``output``."""
    alg = resolve(algorithm)
    check_tensor(input, comm, ReduceOp.SUM, moves_only=True)
    check_tensor(output, comm, ReduceOp.SUM, moves_only=True)
    p = comm.world_size
    _check_sizes(output, input, p, "all_gather")
    comm.admit_collective()
    agree_call(comm, "all_gather", input.shape, input.dtype, "copy", alg.name)
    if p == 1:
        output.view(-1).copy_(input.reshape(-1))
        return output
    sched = shard_schedule(alg, p, Collective.ALL_GATHER)
    identity = list(sched.owners) == list(range(p))
    work = output.view(-1) if identity else torch.empty_like(output.view(-1))
    _shards(work, p)[sched.owners.index(comm.rank)].copy_(input.reshape(-1))
    _execute(comm, sched, work, timeout)
    if not identity:
        out = _shards(output.view(-1), p)
        for c, piece in enumerate(_shards(work, p)):
            out[sched.owners[c]].copy_(piece)
    return output


def _execute(comm: Communicator, sched: Schedule, work: torch.Tensor, timeout) -> None:
    if work.numel() == 0:
        return
    comm.run_schedule(sched, work, timeout=timeout)
