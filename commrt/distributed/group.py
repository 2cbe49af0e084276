"""commrt's torch.distributed process group: every call as a commrt schedule.

torch 2.13 lets a registered Python group replace the whole group, so this
one dispatches by device itself: CPU tensors go over the CPU communicator
(gloo built on the group's store, or MPI when mpiexec started the job and
the group is the world), CUDA tensors over NCCL bootstrapped through the
store (made on the call thread, by the first CUDA call:
:mod:`commrt.distributed.devices`). See :mod:`commrt.distributed.ops`
for what each call runs, :mod:`commrt.distributed.dispatch` for where it
runs and :mod:`commrt.distributed.work` for how works, futures, errors and
CUDA streams behave.
"""

from __future__ import annotations

import torch.distributed as dist

from commrt.distributed import ops
from commrt.distributed.devices import DeviceComms
from commrt.distributed.dispatch import Dispatch, start_p2p
from commrt.distributed.observe import GroupStats, save_traces
from commrt.distributed.torch_api import ProcessGroup
from commrt.distributed.work import CommrtWork

BACKEND_NAME = "commrt"


def _unsupported(method: str, instead: str) -> NotImplementedError:
    return NotImplementedError(f"commrt process group: {method} is not implemented; {instead}")


class NamedGroup(ProcessGroup):
    """The identity torch reads from a group, apart from its calls: the backend name,
    the group's name and description (``init_device_mesh`` and FSDP2 need them), its
    rank and size."""

    def __init__(self, devices: DeviceComms):
        super().__init__(devices.rank, devices.size)
        self.devices = devices
        self.group_id_text, self.desc = devices.group_id, ""

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

    def size(self) -> int:
        return self.devices.size

    def rank(self) -> int:
        return self.devices.rank


class ProcessGroupCommrt(NamedGroup):
    """A torch.distributed group whose calls run commrt schedules (module docs): each
    torch call mapped to :mod:`commrt.distributed.ops`, run by the group's
    :class:`~commrt.distributed.dispatch.Dispatch`."""

    def __init__(self, devices: DeviceComms):
        super().__init__(devices)
        #: how each collective runs, and what the calls ran (:func:`stats`)
        self.dispatch = Dispatch(devices)

    # -- all-reduce
    def allreduce(self, tensors, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def run(dc):
            for t in tensors:
                ops.allreduce(dc, t, op)

        return self.dispatch.call(f"allreduce({op})", tensors, run, opts)

    def allreduce_coalesced(self, tensors, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return self.dispatch.call(
            f"allreduce_coalesced({op})",
            tensors,
            lambda dc: ops.allreduce_coalesced(dc, tensors, op),
            opts,
        )

    def reduce(self, tensors, opts) -> CommrtWork:
        op, root = ops.op_name(opts.reduceOp), opts.rootRank
        return self.dispatch.call(
            "reduce", tensors, lambda dc: ops.reduce_to(dc, tensors[0], root, op), opts
        )

    # -- broadcast
    def broadcast(self, tensors, opts=None) -> CommrtWork:
        root = opts.rootRank if opts is not None else 0

        def run(dc):
            for t in tensors:
                ops.broadcast(dc, t, root)

        return self.dispatch.call("broadcast", tensors, run, opts)

    # -- all-gather
    def allgather(self, output_lists, inputs, opts=None) -> CommrtWork:
        def run(dc):
            for outs, t in zip(output_lists, inputs):
                ops.gather_all(dc, outs, t)

        flat = [t for outs in output_lists for t in outs]
        return self.dispatch.call("allgather", inputs, run, opts, result=flat)

    def allgather_coalesced(self, output_lists, inputs, opts=None) -> CommrtWork:
        """``output_lists[r][i]`` = rank r's ``inputs[i]``."""

        def run(dc):
            for i, t in enumerate(inputs):
                ops.gather_all(dc, [outs[i] for outs in output_lists], t)

        flat = [t for outs in output_lists for t in outs]
        return self.dispatch.call("allgather_coalesced", inputs, run, opts, result=flat)

    def all_gather_single(self, output, input, opts=None) -> CommrtWork:
        return self.dispatch.call(
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

        return self.dispatch.call("all_gather_single_coalesced", inputs, run, opts, result=outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce-scatter
    def reduce_scatter(self, outputs, input_lists, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def run(dc):
            for o, ins in zip(outputs, input_lists):
                ops.reduce_scatter_list(dc, o, ins, op)

        return self.dispatch.call(f"reduce_scatter({op})", outputs, run, opts)

    def reduce_scatter_single(self, output, input, opts=None) -> CommrtWork:
        op = ops.op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return self.dispatch.call(
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

        return self.dispatch.call(f"reduce_scatter_single_coalesced({op})", outputs, run, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- barrier, point-to-point and the rest
    def barrier(self, opts=None) -> CommrtWork:
        return self.dispatch.call("barrier", [], lambda dc: dc.comm.barrier(), opts)

    def gather(self, output_lists, inputs, opts) -> CommrtWork:
        root = opts.rootRank
        outs = output_lists[0] if output_lists else []
        return self.dispatch.call(
            "gather",
            inputs,
            lambda dc: ops.gather_to(dc, outs, inputs[0], root),
            opts,
            result=outs or inputs,
        )

    def scatter(self, outputs, input_lists, opts) -> CommrtWork:
        root = opts.rootRank
        ins = input_lists[0] if input_lists else []
        return self.dispatch.call(
            "scatter", outputs, lambda dc: ops.scatter_from(dc, outputs[0], ins, root), opts
        )

    def alltoall(self, outputs, inputs, opts=None) -> CommrtWork:
        return self.dispatch.call(
            "alltoall", inputs, lambda dc: ops.all_to_all(dc, outputs, inputs), opts, result=outputs
        )

    def all_to_all_single(self, output, input, out_splits, in_splits, opts=None) -> CommrtWork:
        def run(dc):
            ops.all_to_all_single(dc, output, input, out_splits, in_splits)

        return self.dispatch.call("all_to_all_single", [input], run, opts, result=[output])

    alltoall_base = all_to_all_single

    def send(self, tensors, dst: int, tag: int = 0) -> CommrtWork:
        return start_p2p(self.devices, "send", tensors[0], dst, tag, True, self.dispatch.observer)

    def recv(self, tensors, src: int, tag: int = 0) -> CommrtWork:
        return start_p2p(self.devices, "recv", tensors[0], src, tag, False, self.dispatch.observer)

    def recv_anysource(self, tensors, tag: int = 0):
        raise _unsupported("recv_anysource (recv without src)", "pass src= to dist.recv")

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        raise _unsupported("monitored_barrier", "use dist.barrier(), which times out by name")

    def shutdown(self) -> None:
        self.dispatch.close()
        self.devices.close()
        save_traces()

    def abort(self) -> None:
        self.devices.close()


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
    return pg.dispatch.observer.stats
