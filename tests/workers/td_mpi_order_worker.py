"""The "commrt" group under mpiexec with torch ranks given explicitly, in reverse MPI order.

``init_process_group(init_method="tcp://...", rank=, world_size=)`` leaves RANK and
WORLD_SIZE unset (the DDP benchmark starts its group this way): the world group must
still run over MPI, and with torch's rank numbering, not MPI's. Torch rank 0 writes
argv[1] (JSON): the CPU transport, and whether an all-reduce, a broadcast from torch
rank 0 and a send to the next torch rank gave what torch's numbering says.
"""

import json
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

import commrt  # noqa: F401  (registers the backend)
from commrt.cli.launch import free_port


def main(out):
    world = MPI.COMM_WORLD
    port = world.bcast(free_port() if world.Get_rank() == 0 else None)
    p = world.Get_size()
    rank = p - 1 - world.Get_rank()  # torch numbers the processes backwards
    dist.init_process_group(
        "commrt", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p
    )
    total = torch.full((1000,), float(rank + 1))
    dist.all_reduce(total)
    root = torch.full((1000,), float(rank))
    dist.broadcast(root, src=0)
    got = torch.empty(10)
    sent = torch.full((10,), float(rank))
    reqs = [dist.isend(sent, (rank + 1) % p), dist.irecv(got, (rank - 1) % p)]
    for r in reqs:
        r.wait()
    ok = bool(
        torch.equal(total, torch.full((1000,), p * (p + 1) / 2))
        and torch.equal(root, torch.zeros(1000))
        and torch.equal(got, torch.full((10,), float((rank - 1) % p)))
    )
    oks = [False] * p
    dist.all_gather_object(oks, ok)
    if rank == 0:
        cpu = dist.group.WORLD.devices.get(torch.device("cpu")).comm.backend.value
        with open(out, "w") as f:
            json.dump({"cpu_transport": cpu, "results_right": oks}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
