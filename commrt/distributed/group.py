"""commrt's torch.distributed process group: every call as a commrt schedule.

torch 2.13 lets a registered Python group replace the whole group, so this
one dispatches by device itself: CPU tensors go over the CPU communicator
(gloo built on the group's store, or MPI when mpiexec started the job and
the group is the world), CUDA tensors over NCCL bootstrapped through the
store (made on the call thread, by the first CUDA call:
:mod:`commrt.distributed.devices`). See :mod:`commrt.distributed.ops`
for what each call runs and :mod:`commrt.distributed.work` for how works,
futures, errors and CUDA streams behave.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from commrt.distributed import ops
from commrt.distributed.devices import DeviceComms
from commrt.distributed.observe import GroupStats, Observer, save_traces
from commrt.distributed.work import CallQueue, CommrtWork, P2PWork, caller_event
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where

BACKEND_NAME = "commrt"


#: a CPU call made inside autograd's backward (DDP's bucket all-reduces) of at most this many
#: bytes runs on the caller's thread when nothing is queued (CallQueue.submit): a
#: latency-bound call gains less from overlapping the rest of backward than the hand-off to
#: the call thread and back costs, and every rank's backward issues its calls in one order.
#: Where each rank has one core or less (:func:`commrt.runtime.threads.one_core_each`),
#: calls of every size do: the call thread could not overlap the backward, only take turns
#: with it on that core, paying the hand-offs and its waits' polls on top.
HERE_BYTES = 64 << 10


def _here_in_backward(tensors: list, devices: DeviceComms) -> bool:
    """Whether a call is made inside autograd's backward and may run on the caller's
    thread: at most :data:`HERE_BYTES`, or any size where each rank has one core."""
    if torch._C._current_graph_task_id() == -1:  # not inside a backward pass
        return False
    return devices.one_core_each or sum(t.nbytes for t in tensors) <= HERE_BYTES


def _unsupported(method: str, instead: str) -> NotImplementedError:
    return NotImplementedError(f"commrt process group: {method} is not implemented; {instead}")


def _noted(dc, op: str):
    """``dc``, its communicator's position noting the torch.distributed ``op`` it runs."""
    dc.comm.note_op(op)
    return dc


class ProcessGroupCommrt(dist.ProcessGroup):
    """A torch.distributed group whose calls run commrt schedules (module docs)."""

    def __init__(self, devices: DeviceComms):
        super().__init__(devices.rank, devices.size)
        self.devices = devices
        self.calls = CallQueue(f"commrt-pg-{devices.group_id}")
        self.group_id_text, self.desc = devices.group_id, ""
        #: what the calls ran (:func:`stats`, the log line, the trace)
        self.observer = Observer(devices.rank, devices.size, devices.group_id, devices.tracer)

    # -- names (init_device_mesh and FSDP2 need them)
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:
        return self.group_id_text

    def setGroupName(self, name: str) -> None:
        self.group_id_text = name

    def getGroupDesc(self) -> str:
        return self.desc

    def setGroupDesc(self, desc: str) -> None:
        self.desc = desc

    @property
    def group_name(self) -> str:
        return self.group_id_text

    @property
    def group_desc(self) -> str:
        return self.desc

    # -- the machinery every call goes through
    def _call(self, op: str, tensors: list, run, opts=None, result=None) -> CommrtWork:
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
            with work.lock:
                work.waited = True
        after = None if cuda is None else caller_event(cuda)
        observed = self.observer.run
        # the stall verdict names the op (commrt.schedule.position)
        call = lambda: observed(op, tensors, run, _noted(devices.get(device, dtype), op))  # noqa: E731
        here = cuda is None and (sync or _here_in_backward(tensors, devices))
        return self.calls.submit(call, work, cuda, after, here)

    # -- all-reduce
    def allreduce(self, tensors, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def run(dc):
            for t in tensors:
                ops.allreduce(dc, t, op)

        return self._call(f"allreduce({op})", tensors, run, opts)

    def allreduce_coalesced(self, tensors, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return self._call(
            f"allreduce_coalesced({op})",
            tensors,
            lambda dc: ops.allreduce_coalesced(dc, tensors, op),
            opts,
        )

    def reduce(self, tensors, opts) -> CommrtWork:
        op, root = ops.op_name(opts.reduceOp), opts.rootRank
        return self._call(
            "reduce", tensors, lambda dc: ops.reduce_to(dc, tensors[0], root, op), opts
        )

    # -- broadcast
    def broadcast(self, tensors, opts=None) -> CommrtWork:
        root = opts.rootRank if opts is not None else 0

        def run(dc):
            for t in tensors:
                ops.broadcast(dc, t, root)

        return self._call("broadcast", tensors, run, opts)

    # -- all-gather
    def allgather(self, output_lists, inputs, opts=None) -> CommrtWork:
        def run(dc):
            for outs, t in zip(output_lists, inputs):
                ops.gather_all(dc, outs, t)

        flat = [t for outs in output_lists for t in outs]
        return self._call("allgather", inputs, run, opts, result=flat)

    def allgather_coalesced(self, output_lists, inputs, opts=None) -> CommrtWork:
        """``output_lists[r][i]`` = rank r's ``inputs[i]``."""

        def run(dc):
            for i, t in enumerate(inputs):
                ops.gather_all(dc, [outs[i] for outs in output_lists], t)

        flat = [t for outs in output_lists for t in outs]
        return self._call("allgather_coalesced", inputs, run, opts, result=flat)

    def all_gather_single(self, output, input, opts=None) -> CommrtWork:
        return self._call(
            "all_gather_single",
            [input],
            lambda dc: ops.gather_into(dc, output, input),
            opts,
            result=[output],
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> CommrtWork:
        def run(dc):
            for o, i in zip(outputs, inputs):
                ops.gather_into(dc, o, i)

        return self._call("all_gather_single_coalesced", inputs, run, opts, result=outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce-scatter
    def reduce_scatter(self, outputs, input_lists, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def run(dc):
            for o, ins in zip(outputs, input_lists):
                ops.reduce_scatter_list(dc, o, ins, op)

        return self._call(f"reduce_scatter({op})", outputs, run, opts)

    def reduce_scatter_single(self, output, input, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return self._call(
            f"reduce_scatter_single({op})",
            [output],
            lambda dc: ops.scatter_reduce(dc, output, input, op),
            opts,
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def run(dc):
            for o, i in zip(outputs, inputs):
                ops.scatter_reduce(dc, o, i, op)

        return self._call(f"reduce_scatter_single_coalesced({op})", outputs, run, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- barrier, point-to-point and the rest
    def barrier(self, opts=None) -> CommrtWork:
        return self._call("barrier", [], lambda dc: dc.comm.barrier(), opts)

    def gather(self, output_lists, inputs, opts) -> CommrtWork:
        root = opts.rootRank
        outs = output_lists[0] if output_lists else []
        return self._call(
            "gather",
            inputs,
            lambda dc: ops.gather_to(dc, outs, inputs[0], root),
            opts,
            result=outs or inputs,
        )

    def scatter(self, outputs, input_lists, opts) -> CommrtWork:
        root = opts.rootRank
        ins = input_lists[0] if input_lists else []
        return self._call(
            "scatter", outputs, lambda dc: ops.scatter_from(dc, outputs[0], ins, root), opts
        )

    def alltoall(self, outputs, inputs, opts=None) -> CommrtWork:
        return self._call(
            "alltoall", inputs, lambda dc: ops.all_to_all(dc, outputs, inputs), opts, result=outputs
        )

    def all_to_all_single(self, output, input, out_splits, in_splits, opts=None) -> CommrtWork:
        def run(dc):
            ops.all_to_all_single(dc, output, input, out_splits, in_splits)

        return self._call("all_to_all_single", [input], run, opts, result=[output])

    alltoall_base = all_to_all_single

    def send(self, tensors, dst: int, tag: int = 0) -> CommrtWork:
        return start_p2p(self.devices, "send", tensors[0], dst, tag, send=True)

    def recv(self, tensors, src: int, tag: int = 0) -> CommrtWork:
        return start_p2p(self.devices, "recv", tensors[0], src, tag, send=False)

    def recv_anysource(self, tensors, tag: int = 0):
        raise _unsupported("recv_anysource (recv without src)", "pass src= to dist.recv")

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        raise _unsupported("monitored_barrier", "use dist.barrier(), which times out by name")

    def size(self) -> int:
        return self.devices.size

    def rank(self) -> int:
        return self.devices.rank

    def shutdown(self) -> None:
        self.calls.close()
        self.devices.close()
        save_traces()

    def abort(self) -> None:
        self.devices.close()


def start_p2p(
    devices: DeviceComms, what: str, t: torch.Tensor, peer: int, tag: int, send: bool
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
    return P2PWork(
        f"{what} {'to' if send else 'from'} rank {peer}", devices.rank, [t], comm.timeout, ex
    )


def stats(group=None) -> GroupStats:
    """What the commrt process group ``group`` (default: the default group) ran: per
    (op, size, dtype) its calls, bytes, time and algorithm, and why ``auto`` chose it
    (:class:`~commrt.distributed.observe.GroupStats`; module
    :mod:`commrt.distributed.observe`).

    Example::

        >>> dist.init_process_group("commrt")            # doctest: +SKIP
        >>> # train with DDP
        >>> print(commrt.distributed.stats())
        commrt group ...
    """
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise ValueError("commrt.distributed.stats: no process group: call init_process_group")
    if not isinstance(pg, ProcessGroupCommrt):
        raise ValueError(
            f"commrt.distributed.stats: this group runs on {dist.get_backend(pg)}, not on commrt "
            '(dist.init_process_group("commrt"))'
        )
    return pg.observer.stats
