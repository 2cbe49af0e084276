"""What a run needs ready before its first step, cached per communicator: compiled
plans, bindings of a plan to a buffer and a transport, one scratch buffer per dtype and
device, and the memo of the last call (each cache's key, bound and lifetime:
:mod:`commrt.collectives`).

The :class:`~commrt.schedule.executor.Executor` runs what :meth:`Bindings.for_call`
hands it; this module decides what is kept, for how long, and what a repeated call may
skip (its key tuple, hashing and LRU update).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from typing import Callable

import torch

from commrt.schedule import Schedule
from commrt.schedule.bound import Bound
from commrt.schedule.plan import Plan, compile_plan
from commrt.transports.base import Transport

_MAX_PLANS = 64
_MAX_BOUND = 32
#: settled calls kept per communicator: beyond it they are forgotten (and settled again by
#: one full call each), so a program of ever-new shapes holds no growing memory
MAX_SETTLED = 256


@dataclasses.dataclass(slots=True, eq=False)
class Run:
    """One run's binding and what identifies it: the one memo of the last call
    (:attr:`Bindings.memo`), and the :class:`~commrt.schedule.position.Position` record of
    the run begun last (the stall watch reads ``schedule``, ``numel`` and ``dtype``).
    ``kept``: the binding is cached (its owner bounds its life); else it lives for this run
    alone. ``call``: the caller's record of the call that ran it
    (:class:`commrt.collectives.memo.SettledCall` for a settled all-reduce; None for any
    other), which a repeat of that call compares instead of resolving it again: so the
    call and its binding are one memo, checked once
    (:meth:`commrt.schedule.executor.Executor.repeat`)."""

    schedule: Schedule
    data_ptr: int
    numel: int
    dtype: torch.dtype
    transport: Transport
    piece_bytes: int
    reduce: Callable | None
    bound: Bound
    kept: bool
    call: object | None = None


def piece_elems(piece_bytes: int, buf: torch.Tensor) -> int:
    """The elements of ``buf``'s dtype in a piece of at most ``piece_bytes`` (at least 1)."""
    return max(1, piece_bytes // buf.element_size())


class Bindings:
    """An executor's caches: compiled plans (a small LRU), bindings (a small LRU, each
    freed once its owner tensor dies), one scratch buffer per dtype and device, and the
    memo of the last kept run (:class:`Run`). Not thread-safe by itself: the
    :class:`~commrt.Communicator` lock serialises collectives."""

    def __init__(self, reduce: Callable[[torch.Tensor, torch.Tensor], object]):
        #: what a received piece meets where a run names no reducer of its own
        self.reduce = reduce
        self._plans: OrderedDict = OrderedDict()
        self._scratch: dict[tuple, torch.Tensor] = {}
        self._bound: OrderedDict = OrderedDict()
        #: keys whose owner tensor died (filled by weakref finalizers, which also forget the
        #: memo: it may be one of them): their bindings go at the next lookup
        self._dead: list = []
        #: the last cached binding run, with what identifies it and the call that ran it: a
        #: loop on one buffer (a benchmark, one bucket, a settled all-reduce) skips bind()'s
        #: key tuple, hashing and LRU update. None when there is none, and from the moment
        #: an owner dies until the next lookup frees its binding (:meth:`_died`)
        self.memo: Run | None = None

    def __len__(self) -> int:
        """The bindings cached now."""
        return len(self._bound)

    def cached(self) -> tuple[Bound, ...]:
        """The bindings cached now, least recently used first."""
        return tuple(self._bound.values())

    def forget(self, call) -> None:
        """Forget that the last run was ``call``'s (its caller dropped that memo): the next
        such call looks its binding up again."""
        last = self.memo
        if last is not None and last.call is call:
            last.call = None

    def bind(
        self,
        schedule: Schedule,
        buf: torch.Tensor,
        transport: Transport,
        piece_elems: int,
        owner: torch.Tensor | None = None,
        reduce: Callable | None = None,
    ) -> Bound:
        """The cached :class:`Bound` for ``schedule`` on ``buf``, compiled and made on first use;
        ``reduce``: what a received piece meets (None: this executor's own, ``self.reduce``).

        One dictionary lookup when warm. The key holds the buffer's address:
        a binding holds views of ``buf``, so that address cannot be reused
        by another tensor while the binding lives. It is dropped when
        ``owner`` (the caller's tensor) is garbage collected, or when it
        falls out of the small LRU, so the cache never keeps much memory
        alive.
        """
        key = (
            id(schedule),
            buf.data_ptr(),
            buf.numel(),
            buf.dtype,
            piece_elems,
            id(transport),
            reduce,
        )
        hit = self._bound.get(key)
        if hit is not None and hit.schedule is schedule:
            self._bound.move_to_end(key)
            return hit
        self._drop_dead()
        old = self._bound.pop(key, None)
        if old is not None:
            old.free()
        bound = self._bound[key] = self._make(schedule, buf, transport, piece_elems, reduce)
        if owner is not None:
            weakref.finalize(owner, self._died, key)
        if len(self._bound) > _MAX_BOUND:
            self._bound.popitem(last=False)[1].free()
        return bound

    def _make(self, schedule, buf: torch.Tensor, transport, piece_elems: int, reduce) -> Bound:
        # views of a detached alias: a view of ``buf`` itself would hold ``buf`` (its base)
        # alive, and with it the owner whose collection is to free the binding
        flat = buf.detach().view(-1)
        plan = self.plan(schedule, transport.rank, flat.numel(), piece_elems)
        scratch = self.scratch(plan.scratch_numel, flat.dtype, flat.device)
        reducer = self.reduce if reduce is None else reduce
        return Bound(schedule, plan, flat, scratch, transport, reducer)

    def _died(self, key) -> None:
        """``key``'s owner was collected: its binding goes at the next lookup, and the memo
        (which may be it) is forgotten now, so that a repeat never runs it."""
        self._dead.append(key)
        self.memo = None

    def _drop_dead(self) -> None:
        """Free the bindings whose owner died (their views are all that keeps the owner's
        memory alive), and forget the memo, which may be one of them."""
        self.memo = None
        while self._dead:
            dead = self._bound.pop(self._dead.pop(), None)
            if dead is not None:
                dead.free()

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

    def scratch_bytes(self) -> int:
        """Bytes of scratch memory held for receives (kept between calls)."""
        return sum(s.numel() * s.element_size() for s in self._scratch.values())

    def release(self) -> None:
        """Drop cached scratch memory and bindings (re-made on next use)."""
        for b in self._bound.values():
            b.free()
        self._bound.clear()
        self.memo = None
        self._scratch.clear()

    def for_call(self, schedule, buf, transport, piece_bytes, reduce, owner, call) -> Run:
        """The binding for this call, as a :class:`Run`: the last call's when it had the same
        schedule, buffer, transport, piece size and reducer (one comparison per field, the
        hot path of a repeated collective); else a cached one, remembered as the last, when
        ``owner`` bounds its life; else (no owner) one made for this run alone, which the
        run frees, so that no binding outlives a buffer its caller is done with."""
        last = self.memo
        if (
            last is not None
            and last.schedule is schedule
            and last.data_ptr == buf.data_ptr()
            and last.numel == buf.numel()
            and last.dtype is buf.dtype
            and last.transport is transport
            and last.piece_bytes == piece_bytes
            and last.reduce is reduce
        ):
            last.call = call
            return last
        if self._dead:  # whichever path this call takes, a dead owner's binding goes now
            self._drop_dead()
        elems = piece_elems(piece_bytes, buf)
        if owner is None:
            bound = self._make(schedule, buf, transport, elems, reduce)
        else:
            bound = self.bind(schedule, buf, transport, elems, owner, reduce)
        run = Run(
            schedule,
            buf.data_ptr(),
            buf.numel(),
            buf.dtype,
            transport,
            piece_bytes,
            reduce,
            bound,
            owner is not None,
            call,
        )
        if run.kept:
            self.memo = run
        return run


class SettledCalls:
    """The one owner of the memo of calls whose schedule no longer changes
    (:mod:`commrt.collectives.memo`): each caller's record of such a call by its
    signature (``call.key``; at most :data:`MAX_SETTLED`), the signatures one call away
    from settling, and, through the last run (:attr:`Bindings.memo`), which of them ran
    last. Callers ask it and keep no copy; the executor holds it
    (:attr:`commrt.schedule.executor.Executor.settled`)."""

    def __init__(self, bindings: Bindings):
        self._bindings = bindings
        self._by_key: dict = {}
        self._settling: set = set()

    def __len__(self) -> int:
        """The settled calls kept now."""
        return len(self._by_key)

    def get(self, key):
        """The settled call of signature ``key``, or None."""
        return self._by_key.get(key)

    def keep(self, call):
        """Keep ``call`` as its signature's (``call.key``) settled call; return it."""
        if call.key not in self._by_key and len(self._by_key) >= MAX_SETTLED:
            self._by_key.clear()
        self._by_key[call.key] = call
        return call

    def keeps(self, key, learns: bool, settled: bool) -> bool:
        """Whether a first-path call of signature ``key`` whose algorithm answered
        ``settled`` (its ``observe``: the next calls run the same schedule) may keep the
        schedule it ran. One that does not learn: at once. One that learns: on the call
        after the one that answered so, whose ``select`` gives the schedule to keep;
        ``select`` then runs once per call, never again just to ask which schedule to
        keep."""
        if not settled or not learns:
            self._settling.discard(key)
            return settled
        if key in self._settling:
            self._settling.discard(key)
            return True
        self._settling.add(key)
        return False

    def drop(self, call) -> None:
        """Forget ``call``: its signature's next call takes the full path again."""
        if self._by_key.get(call.key) is call:
            del self._by_key[call.key]
        self._bindings.forget(call)

    def clear(self) -> None:
        """Forget every settled call (``COMMRT_DEBUG`` turned on, or a caller that starts
        afresh): every signature's next call takes the full path."""
        self._by_key.clear()
        self._settling.clear()
        last = self._bindings.memo
        if last is not None:
            self._bindings.forget(last.call)
