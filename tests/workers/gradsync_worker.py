"""Run under mpiexec: GradientSync against PyTorch DDP, plus its failure modes.

Rank 0 writes a JSON report to argv[1]. Every case runs 20 steps of SGD with
momentum on the same model, data and seed under DDP (gloo) and under
GradientSync, then compares parameters. The error metric is per tensor:
max|commrt - ddp| / max|ddp|.
"""

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ddp_reference import Net, batch, fresh, rel_err, train_commrt, train_ddp  # noqa: E402

import commrt  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def same_everywhere(world, model):
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    hi, lo = flat.clone(), flat.clone()
    world.Allreduce(MPI.IN_PLACE, hi.numpy(), op=MPI.MAX)
    world.Allreduce(MPI.IN_PLACE, lo.numpy(), op=MPI.MIN)
    return bool(torch.equal(hi, lo))


def main(out):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    port = world.bcast(free_port() if rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p)
    comms = {"mpi": commrt.init("mpi", timeout=30), "gloo": commrt.init("gloo", timeout=30)}
    report = {"world_size": p, "cases": {}}

    ddp = {False: train_ddp(rank, False), True: train_ddp(rank, True)}
    # every rank seeds its own model: GradientSync starts them all from rank 0's, bit for bit
    model = fresh(seed=7 + rank)
    differed = not same_everywhere(world, model)
    sync = commrt.GradientSync(model, comms["mpi"])
    report["same_start"] = {
        "differed_before": differed,
        "identical_after": same_everywhere(world, model),
        "equals_rank0_model": all(
            torch.equal(a, b) for a, b in zip(model.parameters(), fresh().parameters())
        ),
    }
    sync.close()
    for name, transport, accumulate, kw in [
        ("fp32 mpi ring, each rank seeded differently", "mpi", False, {"seed": 7 + rank}),
        ("fp32 mpi ring", "mpi", False, {}),
        ("fp32 gloo halving_doubling", "gloo", False, {"algorithm": "halving_doubling"}),
        ("fp32 mpi torus2d", "mpi", False, {"algorithm": "torus2d"}),
        ("fp32 mpi no_sync accumulation", "mpi", True, {}),
        ("bf16 wire mpi ring", "mpi", False, {"comm_dtype": torch.bfloat16}),
    ]:
        model, nb = train_commrt(comms[transport], rank, accumulate, **kw)
        report["cases"][name] = {
            "rel_err": rel_err(model, ddp[accumulate]),
            "buckets": nb,
            "identical_across_ranks": same_everywhere(world, model),
        }

    # unused parameters: the branch is used on rank 0 only (zeros policy); nobody hangs, all agree
    comm = comms["mpi"]
    model = fresh(branch=True)
    sync = commrt.GradientSync(model, comm, bucket_mb=0.05, first_bucket_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    t0 = time.monotonic()
    for s in range(3):
        x, y = batch(rank, s)
        torch.nn.functional.cross_entropy(model(x, use_branch=(rank == 0)), y).backward()
        sync.step(opt, zero_grad=False)
        branch_grad = model.branch.weight.grad.clone()
        opt.zero_grad()
    sync.close()
    gsum = branch_grad.double().clone()
    world.Allreduce(MPI.IN_PLACE, gsum.numpy(), op=MPI.SUM)
    report["unused_zeros"] = {
        "seconds": time.monotonic() - t0,
        "identical_across_ranks": same_everywhere(world, model),
        "branch_grad_is_average": bool(torch.allclose(gsum, branch_grad.double() * p)),
    }
    # error policy: every rank raises, naming the ranks without the gradient, before any optimizer step
    model = fresh(branch=True)
    before = [p.detach().clone() for p in model.parameters()]
    sync = commrt.GradientSync(model, comm, unused="error")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = batch(rank, 0)
    torch.nn.functional.cross_entropy(sync.model(x, use_branch=(rank == 0)), y).backward()
    try:
        sync.step(opt)
        msg = None
    except ValueError as e:
        msg = str(e)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    sync.close()
    report["unused_error"] = world.gather({"message": msg, "params_unchanged": unchanged}, root=0)

    # a different model on the last rank: every rank raises, nobody hangs
    t0 = time.monotonic()
    try:
        commrt.GradientSync(Net(extra=(rank == p - 1)), comm)
        msg = None
    except commrt.CommError as e:
        msg = str(e)
    report["layout_mismatch"] = world.gather(
        {"message": msg, "seconds": time.monotonic() - t0}, root=0
    )

    # collectives on the same communicator while a step is in flight are refused
    sync = commrt.GradientSync(fresh(), comm)
    x, y = batch(rank, 0)
    torch.nn.functional.cross_entropy(sync.model(x), y).backward()
    try:
        commrt.all_reduce(torch.ones(3), comm)
        report["guard"] = None
    except RuntimeError as e:
        report["guard"] = str(e)
    sync.wait()
    sync.close()

    for c in comms.values():
        c.close()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
