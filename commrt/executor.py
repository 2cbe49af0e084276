"""Runs any :class:`~commrt.schedule.Schedule` on a flat tensor over any transport.

For one rank the schedule is compiled once per (buffer length, element
size, piece size) into a :class:`Plan`: element ranges per step, each large
range cut into *pieces* of at most ``piece_bytes``. Each piece is its own
message, so the reduction of piece ``i`` runs while pieces ``i+1..`` are
still arriving (and the reduced data is still in cache). Reductions land in
a scratch buffer first and are added in by :func:`commrt.kernels.reduce_`
(fp32/fp16/bf16; ``add_`` for float64 and integers);
copies go straight into place when no send of the same step reads there.

bf16 and fp16 buffers are reduced with fp32 arithmetic (each addition is
computed in fp32 and rounded once to the buffer's dtype); partial sums
travel in the buffer's dtype.
"""
from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from commrt.errors import CommError, CommTimeoutError
from commrt.kernels import SUPPORTED_DTYPES as KERNEL_DTYPES, reduce_
from commrt.schedule import OpKind, Schedule, chunk_bounds
from commrt.transports.base import Transport

_MAX_PLANS = 64
_MAX_BOUND = 32
_PIECE_TAGS = 1024   # tags per step: step * 1024 + piece (MPI/gloo also keep FIFO order per tag)


@dataclass(frozen=True)
class Xfer:
    """One message of one step: elements ``[start, stop)`` of the buffer."""

    peer: int
    start: int
    stop: int
    piece: int
    reduce: bool = False
    scratch: int = -1     # offset in the scratch buffer, -1 = straight into the buffer


@dataclass(frozen=True)
class StepPlan:
    index: int
    phase: str
    sends: tuple[Xfer, ...]
    recvs: tuple[Xfer, ...]
    #: a reduction here writes where a send of this step reads: wait for the sends first
    sends_first: bool


@dataclass(frozen=True)
class Plan:
    """A schedule compiled for one rank and one buffer shape."""

    steps: tuple[StepPlan, ...]
    scratch_numel: int
    group_size: int
    num_steps: int
    send_elems: int      # elements this rank sends over the whole schedule


def _pieces(start: int, stop: int, piece: int):
    a = start
    k = 0
    while a < stop:
        b = min(stop, a + piece)
        yield k, a, b
        a, k = b, k + 1


def _overlaps(a0: int, a1: int, ranges) -> bool:
    return any(a0 < b1 and b0 < a1 for b0, b1 in ranges)


def compile_plan(schedule: Schedule, rank: int, numel: int, piece_elems: int) -> Plan:
    """This rank's messages for a buffer of ``numel`` elements (see module doc)."""
    bounds = chunk_bounds(numel, schedule.num_chunks)
    steps = []
    scratch_max = 0
    for index, ((sends, recvs), step) in enumerate(zip(schedule.program(rank), schedule.steps)):
        send_x, recv_x = [], []
        send_ranges = [(bounds[o.lo], bounds[o.hi]) for o in sends]
        recv_ranges = [(bounds[o.lo], bounds[o.hi]) for o in recvs]
        for o in sends:
            for k, a, b in _pieces(bounds[o.lo], bounds[o.hi], piece_elems):
                send_x.append(Xfer(o.peer, a, b, k))
        scratch = 0
        sends_first = False
        for j, o in enumerate(recvs):
            a0, a1 = recv_ranges[j]
            reduce = o.kind is OpKind.RECV_REDUCE
            clash = _overlaps(a0, a1, send_ranges) or _overlaps(a0, a1, recv_ranges[:j] + recv_ranges[j + 1:])
            via_scratch = reduce or clash
            # writing back into the buffer (a sum, or a copy that had to go via
            # scratch) must not race a send of this step still reading there
            sends_first |= via_scratch and _overlaps(a0, a1, send_ranges)
            for k, a, b in _pieces(a0, a1, piece_elems):
                recv_x.append(Xfer(o.peer, a, b, k, reduce, scratch if via_scratch else -1))
                if via_scratch:
                    scratch += b - a
        scratch_max = max(scratch_max, scratch)
        if send_x or recv_x:
            steps.append(StepPlan(index, step.phase, tuple(send_x), tuple(recv_x), sends_first))
    sent = sum(x.stop - x.start for st in steps for x in st.sends)
    return Plan(tuple(steps), scratch_max, len(schedule.ranks), schedule.num_steps, sent)


class Bound:
    """A plan bound to one buffer, one scratch buffer and one transport.

    Holds every tensor view a run needs and each step's :class:`Prepared`
    transport operations (MPI persistent requests), so a repeated
    collective on the same buffer (a GradientSync bucket, a benchmark loop)
    does no slicing and builds no requests. Per step: ``(plan step,
    prepared ops, [(destination view, received view, reduce?) per
    receive])``.
    """

    __slots__ = ("plan", "steps", "views")

    def __init__(self, plan: Plan, buf: torch.Tensor, scratch: torch.Tensor, transport: Transport):
        self.plan = plan
        self.steps = []
        for sp in plan.steps:
            sends = [(buf[x.start:x.stop], x.peer) for x in sp.sends]
            recvs, post = [], []
            for x in sp.recvs:
                into = buf[x.start:x.stop] if x.scratch < 0 else scratch[x.scratch:x.scratch + x.stop - x.start]
                recvs.append((into, x.peer))
                post.append((buf[x.start:x.stop] if x.scratch >= 0 else None, into, x.reduce))
            self.steps.append((sp, transport.prepare(sends, recvs, sp.index * _PIECE_TAGS), post))

    def free(self) -> None:
        for _, prepared, _ in self.steps:
            prepared.free()
        self.steps = []


def default_reduce(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst += src: commrt's fused kernel (Triton) on CUDA; on CPU, when both
    sides share a dtype, one ``add_`` (for fp16/bf16 torch also adds in fp32
    and rounds once: the kernel's semantics, without its per-call checks,
    which cost more than a 64 KB add); otherwise the kernel's reference path.
    float64 and integers: ``add_``."""
    if dst.dtype is src.dtype and (dst.device.type == "cpu" or dst.dtype not in KERNEL_DTYPES):
        dst.add_(src)
    else:
        reduce_(dst, src)


class Executor:
    """Runs schedules; caches compiled plans and one scratch buffer per dtype/device.

    Not thread-safe by itself: the :class:`~commrt.Communicator` lock
    serialises collectives.
    """

    def __init__(self, reduce: Callable[[torch.Tensor, torch.Tensor], object] | None = None):
        self.reduce = reduce or default_reduce
        self._plans: OrderedDict = OrderedDict()
        self._scratch: dict[tuple, torch.Tensor] = {}
        self._bound: OrderedDict = OrderedDict()
        self._dead: list = []   # keys whose owner tensor died (filled by weakref finalizers)

    def bind(self, plan: Plan, buf: torch.Tensor, scratch: torch.Tensor, transport: Transport,
             owner: torch.Tensor | None = None) -> Bound:
        """The cached :class:`Bound` for these buffers, made on first use.

        A binding holds views of ``buf``; it is dropped when ``owner`` (the
        caller's tensor) is garbage collected, or when it falls out of the
        small LRU, so the cache never keeps much memory alive.
        """
        while self._dead:
            dead = self._bound.pop(self._dead.pop(), None)
            if dead is not None:
                dead.free()
        key = (id(plan), buf.data_ptr(), buf.dtype, scratch.data_ptr(), id(transport))
        hit = self._bound.get(key)
        if hit is not None and hit.plan is plan:
            self._bound.move_to_end(key)
            return hit
        bound = self._bound[key] = Bound(plan, buf, scratch, transport)
        if owner is not None:
            weakref.finalize(owner, self._dead.append, key)
        if len(self._bound) > _MAX_BOUND:
            self._bound.popitem(last=False)[1].free()
        return bound

    def plan(self, schedule: Schedule, rank: int, numel: int, piece_elems: int) -> Plan:
        # Keyed on the schedule object itself: algorithms cache their
        # schedules, so this is an identity hit in the common case.
        key = (id(schedule), rank, numel, piece_elems)
        hit = self._plans.get(key)
        if hit is not None and hit[0] is schedule:
            self._plans.move_to_end(key)
            return hit[1]
        plan = compile_plan(schedule, rank, numel, piece_elems)
        self._plans[key] = (schedule, plan)
        if len(self._plans) > _MAX_PLANS:
            self._plans.popitem(last=False)
        return plan

    def scratch(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (dtype, device)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
            self._scratch[key] = buf
        return buf

    def release(self) -> None:
        """Drop cached scratch memory and bindings (re-made on next use)."""
        for b in self._bound.values():
            b.free()
        self._bound.clear()
        self._scratch.clear()

    def run(self, schedule: Schedule, buf: torch.Tensor, transport: Transport, *,
            timeout: float, piece_bytes: int = 4 << 20, average: bool = False,
            bucket: int | None = None, tracer=None, owner: torch.Tensor | None = None) -> int:
        """Run ``schedule`` in place on the 1-D contiguous ``buf``; return the bytes this rank sent.

        ``average`` divides by the number of participating ranks at the end.
        Raises :class:`~commrt.CommTimeoutError` if any wait exceeds
        ``timeout`` seconds, naming the rank, peer, algorithm, step and bucket.
        """
        rank = transport.rank
        if rank not in schedule.ranks:
            return 0
        piece_elems = max(1, piece_bytes // buf.element_size())
        plan = self.plan(schedule, rank, buf.numel(), piece_elems)
        scratch = self.scratch(plan.scratch_numel, buf.dtype, buf.device)
        name = schedule.name

        def fail(what: str, peer: int, sp: StepPlan):
            raise CommTimeoutError(rank=rank, peer=peer, what=what, timeout_s=timeout, algorithm=name,
                                   step=sp.index, num_steps=plan.num_steps, bucket=bucket)

        bound = self.bind(plan, buf, scratch, transport, owner)
        transport.begin(buf)
        with transport.stream():
            for step in bound.steps:
                if tracer is None:
                    self._run_step(step, time.monotonic() + timeout, fail)
                    continue
                sp = step[0]
                with tracer.span(f"commrt/{name}/step{sp.index}", phase=sp.phase, bucket=bucket):
                    self._run_step(step, time.monotonic() + timeout, fail)
            if average and plan.group_size > 1:
                buf.div_(plan.group_size)
        if not transport.sync(time.monotonic() + timeout):
            raise CommTimeoutError(rank=rank, peer=None, what="device stream", timeout_s=timeout,
                                   algorithm=name, bucket=bucket)
        transport.end(buf)
        return plan.send_elems * buf.element_size()

    def _run_step(self, step, deadline: float, fail) -> None:
        sp, prepared, post = step
        pend = prepared.start()
        try:
            if sp.sends_first:
                for j, x in enumerate(sp.sends):
                    if not pend.wait_send(j, deadline):
                        fail("send", x.peer, sp)
            reduce = self.reduce
            for i, (dst, got, is_sum) in enumerate(post):
                if not pend.wait_recv(i, deadline):
                    fail("recv", sp.recvs[i].peer, sp)
                if is_sum:
                    reduce(dst, got)
                elif dst is not None:
                    dst.copy_(got)
            for j in range(len(sp.sends)):
                if not pend.wait_send(j, deadline):
                    fail("send", sp.sends[j].peer, sp)
            pend.finish()
        except CommError:
            raise
        except RuntimeError as e:   # engine errors (a peer's connection closed, ...)
            peers = sorted({x.peer for x in sp.sends + sp.recvs})
            raise CommError(f"commrt: rank {prepared.transport.rank}: {prepared.transport.name} failed in "
                            f"step {sp.index} (peers {peers}){_diagnose(str(e))}: {e}") from e


def _diagnose(engine_message: str) -> str:
    """What an engine's raw error most likely means, in commrt's terms."""
    text = engine_message.lower()
    if "truncat" in text or "preamble" in text:
        return (" — a message was larger than the receive posted for it: the ranks called collectives "
                "of different sizes; run with COMMRT_DEBUG=1 to have every rank name the mismatch")
    if "connection reset" in text or "connection closed" in text or "broken pipe" in text:
        return " — a peer closed its connection: it probably died; look at its output"
    return ""
