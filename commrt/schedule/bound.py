"""A plan bound to one buffer: :class:`Bound`, what :class:`~commrt.schedule.executor.Executor`
caches and runs, and the sum a received piece meets by default (:func:`default_reduce`).

Every view a run needs is cut here once, and each step's transport operations are
prepared once (MPI persistent requests), so a repeated collective on the same buffer
does no slicing, builds no requests and makes no decisions.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch

from commrt.kernels import reduce_
from commrt.schedule import Schedule, tags
from commrt.schedule.plan import Plan, StepPlan, overlaps
from commrt.transports.base import Transport

__all__ = ["Bound", "default_reduce"]

#: CPU dtypes whose received pieces numpy adds in place (numpy's float16 is slow; no bf16)
_NUMPY_ADD = frozenset((torch.float32, torch.float64, torch.int32, torch.int64))
#: elements up to which a piece is added by numpy: torch's grain size, below which its add_
#: runs on one thread as numpy's does (above it torch splits the add across its threads)
_NUMPY_MAX = 32768


def _applier(dst: torch.Tensor | None, got: torch.Tensor, reduce: bool, reducer) -> Callable | None:
    """A no-argument call that adds (``reduce``) or copies the received view ``got`` into
    ``dst``, or None when it was received straight into place."""
    if not reduce:
        return None if dst is None else functools.partial(dst.copy_, got)
    if reducer is not default_reduce:
        return functools.partial(reducer, dst, got)
    if dst.dtype is not got.dtype:  # a cast fused into the add: the kernel's one pass
        return functools.partial(reduce_, dst, got)
    if dst.device.type == "cpu" and dst.dtype in _NUMPY_ADD and dst.numel() <= _NUMPY_MAX:
        # the same IEEE (or wrapping integer) addition as add_, without torch's dispatch:
        # for small pieces torch's per-call dispatch costs more than the add itself
        a = dst.numpy()
        return functools.partial(np.add, a, got.numpy(), a)
    return functools.partial(dst.add_, got)


class Bound:
    """A plan bound to one buffer, one scratch buffer and one transport.

    Holds every tensor view a run needs and each step's :class:`Prepared`
    transport operations (MPI persistent requests), so a repeated
    collective on the same buffer (a GradientSync bucket, a benchmark loop)
    does no slicing, builds no requests and makes no decisions: per step
    ``(plan step, prepared ops, ((receive index, sends to wait for first, apply), ...),
    the sends still to wait for after the last receive)``, where ``apply()`` adds or
    copies the received data into place (None: it was received in place, or added in as
    it arrived, on a transport that :attr:`~commrt.transports.base.Traits.adds_on_receive`
    where no send or other receive of the step touches that range). ``sent_bytes`` is the
    run's constant.
    """

    __slots__ = ("schedule", "plan", "steps", "scratch", "member", "sent_bytes")

    def __init__(
        self,
        schedule: Schedule,
        plan: Plan,
        buf: torch.Tensor,
        scratch: torch.Tensor,
        transport: Transport,
        reducer=None,
    ):
        self.schedule, self.plan, self.scratch = schedule, plan, scratch
        self.member = transport.rank in schedule.ranks
        self.sent_bytes = plan.send_elems * buf.element_size()
        reducer = reducer or default_reduce
        adding = transport.traits.adds_on_receive and reducer is default_reduce
        adding = adding and buf.device.type == "cpu" and buf.dtype in _NUMPY_ADD
        self.steps = []
        for sp in plan.steps:
            sends = [(buf[x.start : x.stop], x.peer) for x in sp.sends]
            recvs, post, adds = [], [], []
            for i, (x, after) in enumerate(zip(sp.recvs, sp.after_sends)):
                adds.append(adding and x.reduce and _alone(x, sp))
                into = (
                    buf[x.start : x.stop]
                    if x.scratch < 0 or adds[-1]
                    else scratch[x.scratch : x.scratch + x.stop - x.start]
                )
                recvs.append((into, x.peer))
                dst = buf[x.start : x.stop] if x.scratch >= 0 and not adds[-1] else None
                post.append((i, after, _applier(dst, into, x.reduce and not adds[-1], reducer)))
            tag = tags.executor(sp.index)
            if any(adds):
                prepared = transport.prepare_adding(sends, recvs, tuple(adds), tag)
            else:
                prepared = transport.prepare(sends, recvs, tag)
            # after_sends never decreases: the receives' waits leave the sends from the
            # last one's count on
            tail = tuple(range(post[-1][1] if post else 0, len(sends)))
            self.steps.append((sp, prepared, tuple(post), tail))

    def free(self) -> None:
        for step in self.steps:
            step[1].free()
        self.steps = []


def _alone(x, sp: StepPlan) -> bool:
    """Whether receive ``x`` may be added into the buffer as its bytes arrive: no send of
    its step reads that range, and no other receive of the step writes it (their adds
    would land in either order, and ranks would round differently)."""
    sends = [(s.start, s.stop) for s in sp.sends]
    others = [(r.start, r.stop) for r in sp.recvs if r is not x]
    return not overlaps(x.start, x.stop, sends) and not overlaps(x.start, x.stop, others)


def default_reduce(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst += src. When both sides share a dtype, one ``add_`` on any device:
    for fp16/bf16 torch adds in fp32 and rounds once, the kernel's semantics,
    and there is no cast to fuse, so the kernel's launch (tens of µs of host
    time on CUDA) and its per-call checks would buy nothing. Mixed dtypes (a
    bf16 wire into fp32): commrt's fused kernel, which casts and adds in one
    pass. (Bound resolves this once per buffer.)"""
    if dst.dtype is src.dtype:
        dst.add_(src)
    else:
        reduce_(dst, src)
