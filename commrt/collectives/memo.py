"""The memo of settled all-reduce calls: :class:`SettledCall`.

A call whose algorithm has nothing more to learn for its size leaves a
:class:`SettledCall` behind, kept per signature by the memo's one owner, the
executor's :class:`~commrt.schedule.caches.SettledCalls` (``comm.executor.settled``,
which every caller asks), and :func:`commrt.all_reduce`
runs a repeat of it (same algorithm and op objects, dtype and shape) without
resolving, checking, ``select`` or ``observe``: it admits the call and hands the
kept schedule to :meth:`commrt.Communicator.run_schedule`, as every call does,
which keeps the call with its binding. That record, the executor's
:attr:`~commrt.schedule.executor.Executor.last`, is the one memo of the last
call: a repeat on the same tensor finds its call and its binding there by
identity tests alone and runs it (:meth:`commrt.Communicator.repeat`).
An algorithm that learns (``auto``) may hand over a counter (its
``settled_counter(comm, nbytes)``) that counts a settled size's calls toward a
recheck, or, where the schedule is kept in a phase of its learning that runs it
(a baseline, a trial's block), a timer (its ``phase_timer(comm, nbytes)``),
called with each call's start, that times them as the full path would, so
that learning's calls cost what settled ones do. When either answers True (a
recheck is due, or the next call runs another schedule), the memo is dropped
(:func:`counted`) and the next calls take the full path, through ``select``
and ``observe``. Every rank makes the same calls and counts alike, so every
rank drops it at the same call. Its bound and lifetime are listed with the
other caches in :mod:`commrt.collectives`.
"""

from __future__ import annotations

import copy

import torch

from commrt.collectives.reductions import REDUCERS, ReduceOp
from commrt.transports.base import average_factor

__all__ = ["SettledCall", "average_scale", "counted", "last_settled"]


class SettledCall:
    """An all-reduce signature whose schedule does not change until its counter says so.

    Made after a call whose algorithm's ``select`` gives the same schedule on the next
    calls (no ``observe``, or ``observe`` said so), and never under ``COMMRT_DEBUG``; kept
    per signature (``key``: resolved algorithm, parsed op, dtype, shape) in
    ``comm.executor.settled``, and with its binding as the last call's
    (:attr:`commrt.schedule.caches.Run.call`).
    A later call with the same ``algorithm`` and ``op`` objects, dtype and shape runs
    ``schedule`` at once, scaled by ``scale`` first (an average: one over the ranks; None
    for any other op) and reducing as ``reduce`` says: a name or an
    instance resolves to the same algorithm every time, the dtype passed the
    communicator's dtype rules for this op, the signature was agreed across ranks
    (checked once per signature, as the full path would find it in ``agreed_calls``),
    and the algorithm said select() keeps returning this schedule until ``counter`` (None:
    for ever) answers True: a settled size's counter, or where ``timed``, the timer of a
    phase of learning, called with each call's start. Every rank makes the same calls and
    keeps and drops each memo at the same call, so every rank takes this path on the same
    calls."""

    __slots__ = (
        *("algorithm", "op", "scale", "reduce", "dtype", "shape"),
        *("schedule", "key", "counter", "timed"),
    )

    def __init__(
        self, algorithm, op, parsed, tensor: torch.Tensor, schedule, key, counter, p, timed=False
    ):
        self.algorithm, self.op = algorithm, op
        self.scale = average_scale(parsed, p)
        self.reduce = REDUCERS.get(parsed)
        self.dtype, self.shape = tensor.dtype, tensor.shape
        self.schedule, self.key, self.counter, self.timed = schedule, key, counter, timed

    def spelled(self, algorithm, op) -> "SettledCall":
        """This call as ``algorithm`` and ``op`` spell it (objects that resolve to this call's
        algorithm and op: a name and an instance, say)."""
        other = copy.copy(self)
        other.algorithm, other.op = algorithm, op
        return other


def average_scale(parsed: ReduceOp, p: int) -> float | None:
    """What an all-reduce with ``parsed`` scales its tensor by before the sum, on ``p``
    ranks: :func:`~commrt.transports.base.average_factor` for an average (the one rule),
    None (nothing) for any other op."""
    return average_factor(p) if parsed is ReduceOp.AVG and p > 1 else None


def counted(comm, settled: SettledCall, started_s: float) -> None:
    """Count a call ``settled`` ran on its counter, or time it on its timer (where
    ``settled.timed``; it started at ``time.perf_counter()`` = ``started_s``); forget the
    memo when either wants the next calls to take the full path."""
    if settled.timed:
        drop = settled.counter(started_s)
    else:
        drop = settled.counter is not None and settled.counter.settled_call()
    if drop:
        comm.executor.settled.drop(settled)


def last_settled(comm) -> SettledCall | None:
    """The settled call that ran last on ``comm`` (the memo a repeat on the same tensor
    finds), or None."""
    run = comm.executor.last
    call = None if run is None else run.call
    return call if isinstance(call, SettledCall) else None
