"""The memo of settled all-reduce calls: :class:`SettledCall`.

A call whose algorithm has nothing more to learn for its size leaves a
:class:`SettledCall` behind, and :func:`commrt.all_reduce` runs a repeat of it
(same algorithm and op objects, dtype and shape) without resolving, checking,
``select`` or ``observe``: it admits the call and hands the kept schedule to
:meth:`commrt.Communicator.run_schedule`, as every call does. An algorithm that
learns (``auto``) may hand over a counter (its ``settled_counter(comm, nbytes)``)
that counts those calls; when the counter wants its kept schedule timed again
(:meth:`~commrt.algorithms.auto_learn.Tuning.settled_call` says so), the memo
is dropped (:func:`counted`) and the next calls take the full path, through
``observe``. Every rank makes the same calls and counts alike, so every rank
drops it at the same call. Its bound and lifetime are listed with the other
caches in :mod:`commrt.collectives`.
"""

from __future__ import annotations

import torch

from commrt.collectives.reductions import REDUCERS, ReduceOp

__all__ = ["SettledCall", "MAX_SETTLED", "remember", "counted"]

#: settled signatures kept per communicator: beyond it they are forgotten (and settled
#: again by one full call each), so a program of ever-new shapes holds no growing memory
MAX_SETTLED = 256


class SettledCall:
    """An all-reduce signature whose schedule does not change until its counter says so.

    Made after a call whose algorithm has nothing more to learn for its size (no
    ``observe``, or ``observe`` said so), and never under ``COMMRT_DEBUG``; kept per
    signature (``key``: resolved algorithm, parsed op, dtype, shape) in
    ``comm.slots.settled_calls`` and, for the last call, in ``comm.slots.settled_call``.
    A later call with the same ``algorithm`` and ``op`` objects, dtype and shape runs
    ``schedule`` at once, reducing as ``average`` and ``reduce`` say: a name or an
    instance resolves to the same algorithm every time, the dtype passed the
    communicator's dtype rules for this op, the signature was agreed across ranks
    (checked once per signature, as the full path would find it in ``agreed_calls``),
    and the algorithm said select() keeps returning this schedule until ``counter`` (None:
    for ever) counts down to a recheck. Every rank makes the same calls and settles each
    size at the same call, so every rank takes this path on the same calls."""

    __slots__ = (
        *("algorithm", "op", "average", "reduce", "dtype", "shape", "on_cpu"),
        *("schedule", "key", "counter"),
    )

    def __init__(self, algorithm, op, parsed, tensor: torch.Tensor, schedule, key, counter):
        self.algorithm, self.op = algorithm, op
        self.average, self.reduce = parsed is ReduceOp.AVG, REDUCERS.get(parsed)
        self.dtype, self.shape, self.on_cpu = tensor.dtype, tensor.shape, tensor.is_cpu
        self.schedule, self.key, self.counter = schedule, key, counter


def remember(slots, settled: SettledCall) -> SettledCall:
    """Keep ``settled`` as its signature's memo and as the last call's."""
    if settled.key not in slots.settled_calls and len(slots.settled_calls) >= MAX_SETTLED:
        slots.settled_calls.clear()
    slots.settled_calls[settled.key] = settled
    slots.settled_call = settled
    return settled


def counted(slots, settled: SettledCall) -> None:
    """Count a call ``settled`` ran on its counter; forget the memo when the counter wants the
    next calls observed again."""
    if settled.counter is not None and settled.counter.settled_call():
        if slots.settled_calls.get(settled.key) is settled:
            del slots.settled_calls[settled.key]
        if slots.settled_call is settled:
            slots.settled_call = None
