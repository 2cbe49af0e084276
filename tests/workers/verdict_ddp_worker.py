"""DDP on the "commrt" backend, 4 ranks: rank 3 hangs in ``load_next_batch`` at step 3
while the others wait in DDP's all-reduce; every rank must print the stall verdict.
Case ``size`` (argv[1]): after 5 agreed ``dist.all_reduce`` calls of 1000 elements,
rank 1 all-reduces 999; ``kill``: rank 2 kills itself (SIGKILL) at step 3; ``timeout``:
as the default case, under a 20 s timeout (VERDICT_TIMEOUT_S) and the default watch."""

import datetime
import os
import signal
import sys
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


def sizes(rank: int) -> None:
    for _ in range(5):
        dist.all_reduce(torch.ones(1000))
    if rank == 1:
        print(f"stall from {time.time():.3f}", flush=True)
    dist.all_reduce(torch.ones(999 if rank == 1 else 1000))


def main(case: str) -> None:
    # VERDICT_TIMEOUT_S: the test's own, shorter than the default 20 s
    timed = float(os.environ.get("VERDICT_TIMEOUT_S", "20"))
    timeout = datetime.timedelta(seconds=timed if case == "timeout" else 120)
    dist.init_process_group("commrt", timeout=timeout)
    rank = dist.get_rank()
    if case == "size":
        sizes(rank)
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(6):
        if case == "kill" and step == 3 and rank == 2:
            print(f"stall from {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        x = load_next_batch(step, rank, hang=case in ("ddp", "timeout") and step == 3 and rank == 3)
        ddp(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
    print(f"rank {rank}: finished", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ddp")
