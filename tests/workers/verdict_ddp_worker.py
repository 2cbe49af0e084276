"""DDP on the "commrt" backend, 4 ranks: rank 3 hangs in ``load_next_batch`` at step 3
while the others wait in DDP's all-reduce; every rank must print the stall verdict."""

import datetime
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commrt  # noqa: F401  (registers the backend)


def load_next_batch(step: int, rank: int, hang: bool) -> torch.Tensor:
    if hang:
        print(f"stall from {time.time():.3f}", flush=True)  # the test's bound starts here
        time.sleep(300)  # a data loader that hangs
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + rank))


def main() -> None:
    dist.init_process_group("commrt", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(6):
        x = load_next_batch(step, rank, hang=step == 3 and rank == 3)
        ddp(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
    print(f"rank {rank}: finished", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
