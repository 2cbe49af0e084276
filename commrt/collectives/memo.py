"""The memo of settled all-reduce calls: :class:`SettledCall`.

A call whose algorithm has nothing more to learn for its size leaves a
:class:`SettledCall` behind, and :func:`commrt.all_reduce` runs a repeat of
it (same algorithm and op objects, dtype and shape) at once, without
resolving, checking, ``select`` or ``observe``. An algorithm that learns
(``auto``) may hand over a watch (its ``settled_watch(comm, nbytes)``) that
counts those calls; when the watch wants its kept schedule timed again
(:meth:`~commrt.algorithms.auto_learn.Tuning.settled_call` says so), the
memo is dropped and the next calls take the full path, through ``observe``.
Every rank makes the same calls and counts alike, so every rank drops it at
the same call.
"""

from __future__ import annotations

import torch

__all__ = ["SettledCall", "MAX_SETTLED", "run_settled", "remember"]

#: settled signatures kept per communicator: beyond it they are forgotten (and settled
#: again by one full call each), so a program of ever-new shapes holds no growing memory
MAX_SETTLED = 256


class SettledCall:
    """An all-reduce signature whose schedule does not change until its watch says so.

    Made after a call whose algorithm has nothing more to learn for its size (no
    ``observe``, or ``observe`` said so), and never under ``COMMRT_DEBUG``; kept per
    signature (``key``) in ``comm.slots.settled_calls`` and, for the last call, in
    ``comm.slots.settled_call``. A later call with the same ``algorithm`` and ``op``
    objects, dtype and shape runs ``schedule`` at once: a name or an instance resolves to
    the same algorithm every time, the signature was agreed across ranks (checked once
    per signature, as the full path would find it in ``agreed_calls``), and the algorithm
    said select() keeps returning this schedule until ``watch`` (None: for ever) counts
    down to a recheck. Every rank makes the same calls and settles each size at the same
    call, so every rank takes this path on the same calls."""

    __slots__ = (
        *("algorithm", "op", "average", "dtype", "shape", "on_cpu"),
        *("schedule", "key", "watch"),
    )

    def __init__(self, algorithm, op, average: bool, tensor: torch.Tensor, schedule, key, watch):
        self.algorithm, self.op, self.average = algorithm, op, average
        self.dtype, self.shape, self.on_cpu = tensor.dtype, tensor.shape, tensor.is_cpu
        self.schedule, self.key, self.watch = schedule, key, watch


def remember(slots, settled: SettledCall) -> SettledCall:
    """Keep ``settled`` as its signature's memo and as the last call's."""
    if settled.key not in slots.settled_calls and len(slots.settled_calls) >= MAX_SETTLED:
        slots.settled_calls.clear()
    slots.settled_calls[settled.key] = settled
    slots.settled_call = settled
    return settled


def run_settled(tensor, comm, settled: SettledCall, timeout, tracer) -> torch.Tensor:
    """Run the memo's schedule on ``tensor``; count the call on its watch, and forget the
    memo when the watch wants the next calls observed again."""
    if timeout is None and tracer is None and tensor.is_contiguous():
        # the hot loop of a repeated small call: the communicator's own options, so
        # run_schedule's per-call ones need no resolving (a tenth of an 8-byte all-reduce)
        with comm.lock:
            comm.executor.run(
                settled.schedule, tensor, comm.transport, timeout=comm.timeout,
                piece_bytes=comm.piece_bytes, average=settled.average, owner=tensor,
                spin_s=comm.spin_s,
            )  # fmt: skip
    else:
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        comm.run_schedule(
            settled.schedule, work, timeout=timeout, average=settled.average, tracer=tracer,
            owner=work,
        )  # fmt: skip
        if work is not tensor:
            tensor.copy_(work)
    if settled.watch is not None and settled.watch.settled_call():
        slots = comm.slots
        if slots.settled_calls.get(settled.key) is settled:
            del slots.settled_calls[settled.key]
        if slots.settled_call is settled:
            slots.settled_call = None
    return tensor
