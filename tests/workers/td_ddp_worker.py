"""DDP over the "commrt" torch.distributed backend against the same DDP over gloo.

Launched torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or by
mpiexec (MASTER_ADDR and MASTER_PORT in the environment; rank and size from
MPI). The default group is commrt's (algorithm from COMMRT_ALGORITHM); argv[2]
names more algorithms (comma-separated), each a commrt group made with
COMMRT_ALGORITHM set to it. A gloo group of the same ranks is the reference.
Each mode trains the same model on the same data under each and rank 0 writes
the largest relative parameter difference per algorithm and mode to argv[1]
(JSON).
"""

import json
import os
import sys
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ddp_reference import batch, fresh, rel_err  # noqa: E402

import commrt  # noqa: E402,F401  (registers the backend)
from commrt.distributed import dispatch as commrt_dispatch  # noqa: E402
from commrt.distributed import ops  # noqa: E402

STEPS = 10
MODES = ("plain", "unused", "static")


def train(group, rank, mode):
    model = fresh(branch=mode == "unused")
    kw = {"unused": {"find_unused_parameters": True}, "static": {"static_graph": True}}
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.05, **kw.get(mode, {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for s in range(STEPS):
        x, y = batch(rank, s)
        out = ddp(x, use_branch=mode == "unused" and s % 2 == 0)
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()
        opt.zero_grad()
    return model


#: the threads that ran the default group's all-reduces above commrt_dispatch.HERE_BYTES
LARGE_CALL_THREADS: set = set()


def _record_large_calls():
    """Note which thread runs each large all-reduce (the caller's, or the call thread)."""
    run = ops.allreduce

    def recorded(dc, t, op):
        if t.nbytes > commrt_dispatch.HERE_BYTES:
            LARGE_CALL_THREADS.add(threading.current_thread().name)
        return run(dc, t, op)

    ops.allreduce = recorded


def main(out, more):
    _record_large_calls()
    dist.init_process_group("commrt")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    groups = {dist.group.WORLD.devices.algorithm.name: None}
    for name in filter(None, more.split(",")):
        os.environ["COMMRT_ALGORITHM"] = name  # read when the group is made
        g = dist.new_group(backend="commrt")
        groups[g.devices.algorithm.name] = g
    report = {
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "group": type(dist.group.WORLD).__name__,
        "cpu_transport": dist.group.WORLD.devices.get(torch.device("cpu")).comm.backend.value,
        "errors": {},
    }
    for mode in MODES:
        ref = train(gloo, rank, mode)
        for name, group in groups.items():
            ours = train(group, rank, mode)
            report["errors"][f"{name}/{mode}"] = rel_err(ours, ref)
    # every rank ends with the same parameters as every other
    flat = torch.cat([p.detach().flatten() for p in ours.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=gloo)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=gloo)
    report["ranks_agree"] = bool(torch.equal(lo, hi))
    report["one_core_each"] = dist.group.WORLD.devices.one_core_each
    report["large_call_threads"] = sorted(LARGE_CALL_THREADS)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
