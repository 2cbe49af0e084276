"""3 ranks under torchrun: at step 3 rank 1 SIGKILLs itself, rank 0 waits for it in the
step's all-reduce, and rank 2 sits in its data loader, so that it learns of the death only
from torchrun's SIGTERM. argv[1]: ``sync`` (GradientSync, ring, over gloo) or ``ddp``
(DDP on the "commrt" backend). Every rank that ends its loop prints "finished"."""

import os
import signal
import sys
import time

import torch

import commrt


def load_next_batch(rank: int, step: int) -> torch.Tensor:
    if rank == 2 and step == 3:
        time.sleep(120)  # a slow data loader: in user code when rank 1 dies
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(10 * step + rank))


def main(mode: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if mode == "ddp":
        import torch.distributed as dist

        dist.init_process_group("commrt")
        rank, step_of = dist.get_rank(), None
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        comm = commrt.init("gloo")
        rank = comm.rank
        step_of = commrt.GradientSync(model, comm, algorithm="ring", bucket_mb=0.001).step
    for step in range(8):
        if rank == 1 and step == 3:
            print(f"killed at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        model(load_next_batch(rank, step)).square().mean().backward()
        if step_of is not None:
            step_of(opt)
        else:
            opt.step()
            opt.zero_grad()
    print(f"rank {rank}: finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
