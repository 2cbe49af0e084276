"""GradientSync on 4 gloo ranks, rank 3 the culprit at step 2.

With backup workers (3 + 1), rank 3 falls behind (``late``: sleeps in
``load_next_batch`` for three stall watches) or dies (``dead``: SIGKILL): the
protocol drops it and the others go on, so no stall verdict may name it.
With the ring (``ring``), rank 3 hangs in ``load_next_batch`` and the others
wait in the bucket's all-reduce: the verdict names it. Every rank that ends
its loop prints "finished"."""

import os
import signal
import sys
import time

import torch

import commrt
from commrt.algorithms import BackupWorkers

STEPS = 8


def load_next_batch(rank: int, step: int, hang_s: float) -> torch.Tensor:
    time.sleep(hang_s)  # a slow data loader
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(100 * rank + step))


def main(case: str) -> None:
    comm = commrt.init("gloo", timeout=60)
    rank, stall_s = comm.rank, float(os.environ["COMMRT_STALL_S"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    algorithm = "ring" if case == "ring" else BackupWorkers(backups=1, dead_after_s=2.0)
    sync = commrt.GradientSync(model, comm, algorithm=algorithm, bucket_mb=0.001)
    for step in range(STEPS):
        culprit = rank == comm.world_size - 1 and step == 2
        if culprit and case == "dead":
            os.kill(os.getpid(), signal.SIGKILL)
        hang_s = 300 if case == "ring" else 3 * stall_s
        if culprit and case == "ring":
            print(f"stall from {time.time():.3f}", flush=True)  # the test's bound starts here
        x = load_next_batch(rank, step, hang_s if culprit else 0.1)
        model(x).square().mean().backward()
        sync.step(opt)
    print(f"rank {rank}: finished", flush=True)
    sync.close()
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1])
