"""FSDP2 (fully_shard) on CPU over the "commrt" backend against the same over gloo.

Launched torchrun-style. The commrt mesh comes from init_device_mesh on the
default (commrt) group; the gloo mesh from a gloo group of the same ranks.
Ten SGD steps on the same model and data; rank 0 writes the largest
relative difference of the full parameters to argv[1].
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import commrt  # noqa: F401  (registers the backend)

STEPS = 10


def train(mesh, rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 33),
        torch.nn.ReLU(),
        torch.nn.Linear(33, 4),
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for s in range(STEPS):
        g = torch.Generator().manual_seed(100 * s + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def main(out):
    dist.init_process_group("commrt")
    rank, p = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    ours = train(init_device_mesh("cpu", (p,)), rank)
    ref = train(DeviceMesh.from_group(gloo, "cpu"), rank)
    err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(ours, ref))
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rel_err": err, "tensors": len(ours), "world_size": p}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
