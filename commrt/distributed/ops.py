"""What each torch.distributed call runs on a commrt communicator.

Plain functions on one device's :class:`DeviceContext` (the communicator and
the group's all-reduce algorithm); the process group
(:mod:`commrt.distributed.group`) queues them on its call thread
(:mod:`commrt.distributed.dispatch`).

* all-reduce: every op through :func:`commrt.all_reduce`, on a communicator
  whose dtype rules are gloo's and NCCL's (SUM of int8, uint8, int16 and bool
  too, a bool sum being an or; :mod:`commrt.collectives.reductions`); AVG is
  commrt's own (1/p applied before the sum, as everywhere in commrt); MIN, MAX,
  PRODUCT and the bitwise BAND, BOR and BXOR run the same
  schedule with another reduction in the executor. PREMUL_SUM raises
  ``NotImplementedError``.
* reduce-scatter and all-gather: :mod:`commrt.collectives.shards` (ring, halving-
  doubling on a power of two, torus2d; the others fall back to ring).
* broadcast: :func:`commrt.broadcast` (binomial tree or pipelined chain).
* gather, scatter, all-to-all: one group of point-to-point messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from commrt.algorithms import Algorithm, Ring
from commrt.collectives.core import SUPPORTED_DTYPES, agree_call, all_reduce, use_dtype_rules
from commrt.collectives.core import broadcast as commrt_broadcast
from commrt.collectives.reductions import SPELLINGS, TORCH
from commrt.collectives.shards import all_gather, reduce_scatter
from commrt.runtime.communicator import Communicator
from commrt.schedule import Collective, tags
from commrt.schedule.p2p import Exchange, Where

R = dist.ReduceOp


def op_name(op) -> str:
    """``"sum"``, ``"avg"``, ``"min"``, ``"max"``, ``"product"``, ``"band"``, ``"bor"`` or
    ``"bxor"``; NotImplementedError naming any other torch op."""
    for name, known in (
        ("sum", R.SUM),
        ("avg", R.AVG),
        ("min", R.MIN),
        ("max", R.MAX),
        ("product", R.PRODUCT),
        ("band", R.BAND),
        ("bor", R.BOR),
        ("bxor", R.BXOR),
    ):
        if op == known:
            return name
    named = [n for n, m in R.RedOpType.__members__.items() if op == m]
    raise NotImplementedError(
        f"commrt process group: reduce op {named[0] if named else op} is not supported (SUM, "
        "AVG, MIN, MAX, PRODUCT, BAND, BOR and BXOR are); for PREMUL_SUM scale the tensor "
        "first and use SUM"
    )


@dataclass
class DeviceContext:
    """One device type's communicator and what the group's calls need with it: the
    group's all-reduce algorithm, and the tracer its calls record into (None: no trace,
    :mod:`commrt.distributed.observe`)."""

    comm: Communicator
    algorithm: Algorithm
    tracer: object = None

    def __post_init__(self):
        # torch.distributed's contract on this communicator: the dtypes gloo and NCCL reduce
        use_dtype_rules(self.comm, TORCH)

    def shard_algorithm(self) -> Algorithm:
        """The group's algorithm where it has reduce-scatter and all-gather schedules
        for this p, else ring."""
        alg, p = self.algorithm, self.comm.world_size
        ok = alg.supports(Collective.REDUCE_SCATTER) and alg.supports(Collective.ALL_GATHER)
        if ok and (alg.name != "halving_doubling" or p & (p - 1) == 0):
            return alg
        return Ring()


def allreduce(dc: DeviceContext, t: torch.Tensor, op: str) -> None:
    # torch's groups ignore autograd (DDP with create_graph=True hands in gradients that
    # require grad); commrt's collectives refuse such tensors, so they get the plain data
    t = t.detach()
    if dc.tracer is None:  # a repeated small call pays for every keyword argument
        all_reduce(t, dc.comm, dc.algorithm, SPELLINGS[op])
    else:
        all_reduce(t, dc.comm, dc.algorithm, SPELLINGS[op], tracer=dc.tracer)


def allreduce_coalesced(dc: DeviceContext, tensors: list[torch.Tensor], op: str) -> None:
    """One all-reduce per dtype over the tensors packed into one flat buffer."""
    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        allreduce(dc, flat, op)
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def broadcast(dc: DeviceContext, t: torch.Tensor, root: int) -> None:
    commrt_broadcast(t.detach(), dc.comm, root, tracer=dc.tracer)


def check_list(what: str, role: str, tensors: list, like: torch.Tensor, p: int) -> None:
    """ValueError unless ``tensors`` holds one tensor a rank, each of ``like``'s size and
    dtype. Checked here, before any message: the call check that would catch other ranks'
    sizes runs on a call signature's first use only, and a list sized otherwise on one
    rank than on another would leave its peers waiting for bytes that never come."""
    if len(tensors) != p:
        raise ValueError(f"{what}: {len(tensors)} {role} tensors for {p} ranks")
    for i, o in enumerate(tensors):
        if o.numel() != like.numel() or o.dtype != like.dtype:
            raise ValueError(
                f"{what}: {role} tensor {i} is {o.dtype} of shape {list(o.shape)}; every "
                f"{role} must match {like.dtype} of {like.numel()} elements"
            )


def gather_all(dc: DeviceContext, outputs: list[torch.Tensor], t: torch.Tensor) -> None:
    """torch's list all-gather: ``outputs[r]`` = rank r's ``t``."""
    t = t.detach()
    check_list("all_gather", "output", outputs, t, dc.comm.world_size)
    flat = torch.empty(t.numel() * len(outputs), dtype=t.dtype, device=t.device)
    all_gather(flat, t.contiguous(), dc.comm, dc.shard_algorithm())
    for o, piece in zip(outputs, flat.chunk(len(outputs)) if flat.numel() else outputs):
        if piece is not o:
            o.copy_(piece.view_as(o))


def gather_into(dc: DeviceContext, out: torch.Tensor, t: torch.Tensor) -> None:
    """``all_gather_into_tensor``: shard r of ``out`` = rank r's ``t``."""
    out, t = out.detach(), t.detach()
    target = (
        out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    )
    all_gather(target, t.contiguous(), dc.comm, dc.shard_algorithm())
    if target is not out:
        out.copy_(target)


def scatter_reduce(dc: DeviceContext, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
    """``reduce_scatter_tensor``: rank r's ``out`` = the reduction of every rank's shard r."""
    out, inp = out.detach(), inp.detach()
    if op == "avg" or (op == "sum" and inp.dtype in SUPPORTED_DTYPES):
        target = (
            out
            if out.is_contiguous()
            else torch.empty_like(out, memory_format=torch.contiguous_format)
        )
        reduce_scatter(target, inp, dc.comm, dc.shard_algorithm(), op)
        if target is not out:
            out.copy_(target)
        return
    full = inp.detach().clone().reshape(-1)  # MIN/MAX/PRODUCT: all-reduce, keep my shard
    allreduce(dc, full, op)
    out.copy_(full.chunk(dc.comm.world_size)[dc.comm.rank].view_as(out))


def reduce_scatter_list(dc: DeviceContext, out: torch.Tensor, inputs: list, op: str) -> None:
    check_list("reduce_scatter", "input", inputs, out, dc.comm.world_size)
    scatter_reduce(dc, out, torch.cat([t.reshape(-1) for t in inputs]), op)


def reduce_to(dc: DeviceContext, t: torch.Tensor, root: int, op: str) -> None:
    """``reduce``: the root's tensor ends with the reduction; the others' are untouched."""
    allreduce(dc, t if dc.comm.rank == root else t.clone(), op)


def _exchange(dc: DeviceContext, sends, recvs, what: str) -> None:
    comm = dc.comm
    comm.admit_collective()
    Exchange(comm, sends, recvs, tags.TORCH_COLLECTIVE, Where(what)).complete()


def gather_to(dc: DeviceContext, outputs: list, t: torch.Tensor, root: int) -> None:
    comm = dc.comm
    t = t.contiguous()
    agree_call(comm, "other", t.shape, t.dtype, f"gather{root}", "p2p")
    if comm.rank != root:
        _exchange(dc, [(t, root)], [], "gather")
        return
    bufs = {r: torch.empty_like(t) for r in range(comm.world_size) if r != root}
    _exchange(dc, [], [(b, r) for r, b in bufs.items()], "gather")
    for r, o in enumerate(outputs):
        o.copy_(t if r == root else bufs[r])


def scatter_from(dc: DeviceContext, out: torch.Tensor, inputs: list, root: int) -> None:
    comm = dc.comm
    agree_call(comm, "other", out.shape, out.dtype, f"scatter{root}", "p2p")
    if comm.rank != root:
        buf = (
            out
            if out.is_contiguous()
            else torch.empty_like(out, memory_format=torch.contiguous_format)
        )
        _exchange(dc, [], [(buf, root)], "scatter")
        if buf is not out:
            out.copy_(buf)
        return
    sends = [(inputs[r].contiguous(), r) for r in range(comm.world_size) if r != root]
    _exchange(dc, sends, [], "scatter")
    out.copy_(inputs[root])


def all_to_all(dc: DeviceContext, outs: list, ins: list) -> None:
    """Rank r's ``outs[s]`` = rank s's ``ins[r]``, one group of messages."""
    comm = dc.comm
    agree_call(comm, "other", (len(ins),), ins[0].dtype if ins else torch.float32, "a2a", "p2p")
    me = comm.rank
    bufs = {
        s: torch.empty_like(outs[s], memory_format=torch.contiguous_format)
        for s in range(comm.world_size)
        if s != me
    }
    sends = [(ins[s].contiguous(), s) for s in range(comm.world_size) if s != me]
    _exchange(dc, sends, [(b, s) for s, b in bufs.items()], "alltoall")
    outs[me].copy_(ins[me])
    for s, b in bufs.items():
        outs[s].copy_(b)


def all_to_all_single(
    dc: DeviceContext, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits
) -> None:
    p = dc.comm.world_size
    outs = _split(out, out_splits, p)
    ins = _split(inp, in_splits, p)
    all_to_all(dc, outs, ins)


def _split(t: torch.Tensor, splits, p: int) -> list[torch.Tensor]:
    if not splits:
        if t.shape[0] % p:
            raise ValueError(f"all_to_all_single: dim 0 ({t.shape[0]}) does not split into {p}")
        splits = [t.shape[0] // p] * p
    return list(torch.split(t, list(splits)))
