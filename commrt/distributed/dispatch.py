"""Where and how a process group's call runs: its work, its thread, its record.

:class:`Dispatch` is the machinery every collective of
:class:`~commrt.distributed.group.ProcessGroupCommrt` goes through, kept apart
from torch's ``ProcessGroup`` surface so that each says one thing: the group
maps torch's calls to :mod:`commrt.distributed.ops`; the dispatch makes the
call's work, picks the thread it runs on (the call thread, or the caller's
inside backward), orders it after the caller's CUDA stream and records it in
the group's :class:`~commrt.distributed.observe.Observer`.
:func:`start_p2p` starts a send or receive, which never queues.
"""

from __future__ import annotations

from functools import partial

import torch

from commrt.distributed.devices import DeviceComms
from commrt.distributed.observe import Observer
from commrt.distributed.torch_api import in_backward
from commrt.distributed.work import CallQueue, CommrtWork, P2PWork, caller_event
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where

#: a CPU call made inside autograd's backward (DDP's bucket all-reduces) of at most this many
#: bytes runs on the caller's thread when nothing is queued (CallQueue.submit): a
#: latency-bound call gains less from overlapping the rest of backward than the hand-off to
#: the call thread and back costs, and every rank's backward issues its calls in one order.
#: Where each rank has one core or less (:func:`commrt.process.threads.one_core_each`),
#: calls of every size do: the call thread could not overlap the backward, only take turns
#: with it on that core, paying the hand-offs and its waits' polls on top.
HERE_BYTES = 64 << 10


def here_in_backward(tensors: list, devices: DeviceComms) -> bool:
    """Whether a call is made inside autograd's backward and may run on the caller's
    thread: at most :data:`HERE_BYTES`, or any size where each rank has one core."""
    if not in_backward():
        return False
    return devices.one_core_each or sum(t.nbytes for t in tensors) <= HERE_BYTES


def _noted(dc, op: str):
    """``dc``, its communicator's position noting the torch.distributed ``op`` it runs."""
    dc.comm.note_op(op)
    return dc


class Dispatch:
    """Runs one process group's collectives: each on the group's call thread (or the
    caller's, :func:`here_in_backward`), as a :class:`~commrt.distributed.work.CommrtWork`,
    recorded by :attr:`observer`."""

    def __init__(self, devices: DeviceComms):
        self.devices = devices
        self.calls = CallQueue(f"commrt-pg-{devices.group_id}")
        #: what the calls ran (:func:`commrt.distributed.group.stats`, the log line, the trace)
        self.observer = Observer(devices.rank, devices.size, devices.group_id, devices.tracer)

    def call(self, op: str, tensors: list, run, opts=None, result=None) -> CommrtWork:
        """Queue ``run(device_context)`` on the call thread for the device of
        ``tensors[0]``, recorded as ``op`` (:mod:`commrt.distributed.observe`); the work's
        future holds ``result`` (default ``tensors``). On CUDA
        the call thread runs on the group's device, after the caller's current stream as
        it is now (:mod:`commrt.distributed.work`), and makes the communicator if it is the
        first CUDA call."""
        device = tensors[0].device if tensors else torch.device("cpu")
        devices = self.devices
        cuda = devices.check(device)  # a bad device is the caller's error, raised here
        dtype = tensors[0].dtype if tensors else None
        what = f"{op} on {device.type}, algorithm {devices.algorithm.name}"
        work = CommrtWork(
            what,
            devices.rank,
            tensors if result is None else result,
            devices.timeout,
            () if cuda is None else [cuda],
        )
        sync = opts is not None and not getattr(opts, "asyncOp", True)
        if sync:
            # torch waits on a synchronous call's work itself: mark it waited before it
            # runs, so that an error is raised from that wait, never turned into an abort
            work.mark_waited()
        after = None if cuda is None else partial(caller_event, cuda)  # made if queued
        observed = self.observer.run
        # the stall verdict names the op (commrt.schedule.position)
        call = lambda: observed(op, tensors, run, _noted(devices.get(device, dtype), op))  # noqa: E731
        here = sync or here_in_backward(tensors, devices)
        return self.calls.submit(call, work, cuda, after, here)

    def close(self) -> None:
        """Stop the call thread (after the calls already queued)."""
        self.calls.close()


def start_p2p(
    devices: DeviceComms,
    what: str,
    t: torch.Tensor,
    peer: int,
    tag: int,
    send: bool,
    observer: Observer | None = None,
) -> P2PWork:
    """A send or receive, started on the caller's thread: over the CPU communicator
    (tagged), or on CUDA over the pair's own NCCL communicator
    (:meth:`~commrt.distributed.devices.DeviceComms.pair`), never the group's: NCCL
    matches per peer in issue order, so a send issued here between two collectives the
    call thread issues could land in one's receive."""
    cuda = devices.check(t.device)
    if not t.is_contiguous():
        raise ValueError(f"commrt process group: {what} needs a contiguous tensor")
    if cuda is None:
        comm, their, where = devices.get(t.device).comm, peer, f"torch {what}"
    else:
        comm = devices.pair(peer, cuda)
        their = 1 - comm.rank
        low, high = sorted((devices.rank, peer))
        where = f"torch {what} (pair communicator {low}:{high})"
    pair = [(t, their)]
    ex = Exchange(
        comm, pair if send else [], [] if send else pair, tags.torch_p2p(tag), Where(where)
    )
    completed = None if observer is None else partial(observer.p2p, what, t, comm)
    return P2PWork(
        f"{what} {'to' if send else 'from'} rank {peer}",
        devices.rank,
        [t],
        comm.timeout,
        ex,
        completed,
    )
