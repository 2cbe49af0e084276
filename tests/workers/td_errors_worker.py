"""Bad input and a dead rank on the "commrt" backend (launched torchrun-style).

argv[2] == "bad": unsupported ops and calls, then a size mismatch; every
rank records the error each raised (type and message) and rank 0 writes
them all to argv[1].
argv[2] == "kill": DDP on 4 ranks; rank 2 kills itself (SIGKILL) in the
middle of iteration 3's backward. The survivors must end (the test reads
their exit codes and output): commrt's named error, no hang, no segfault.
"""

import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commrt  # noqa: F401  (registers the backend)


def attempt(name, fn, seen):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test wants every error's type and text
        seen[name] = [type(e).__name__, str(e)]
    else:
        seen[name] = None


def bad(out):
    rank = dist.get_rank()
    seen = {}
    t = torch.ones(4)
    attempt("band", lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND), seen)  # a float
    attempt("premul", lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)), seen)
    attempt("recv_anysource", lambda: dist.recv(torch.empty(2)), seen)
    attempt("monitored_barrier", lambda: dist.monitored_barrier(), seen)
    flags = torch.tensor([rank == 0, False])
    attempt("bool", lambda: dist.all_reduce(flags), seen)
    seen["bool_sum"] = flags.tolist()
    # an all-gather agreed once, then one whose list each rank sizes by its own input:
    # the call check is not run again, so the lists themselves must be checked
    outs = [torch.empty(2) for _ in range(dist.get_world_size())]
    attempt("gather_even", lambda: dist.all_gather(outs, torch.ones(2)), seen)
    uneven = [torch.empty(r + 1) for r in range(dist.get_world_size())]
    attempt("gather_uneven", lambda: dist.all_gather(uneven, torch.ones(rank + 1)), seen)
    wrong = [torch.ones(3) for _ in range(dist.get_world_size())]
    attempt("rs_list", lambda: dist.reduce_scatter(torch.empty(2), wrong), seen)
    attempt("still_works", lambda: dist.all_reduce(t), seen)
    seen["sum_after"] = t[0].item()
    # ranks call different sizes: commrt's call check names both sides on every rank
    attempt("mismatch", lambda: dist.all_reduce(torch.ones(10 + rank)), seen)
    path = f"{out}.{rank}"
    with open(path, "w") as f:
        json.dump(seen, f)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 256), torch.nn.Linear(256, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def kill():
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(model, bucket_cap_mb=0.01)
    for step in range(6):
        if step == 3 and rank == 2:
            # dies after its last bucket's gradient is ready but before it is reduced
            model.a.weight.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
        ddp(torch.randn(16, 32)).sum().backward()
        print(f"rank {rank} finished step {step}", flush=True)
    print(f"rank {rank} ran past the dead rank", flush=True)


if __name__ == "__main__":
    dist.init_process_group("commrt", timeout=datetime.timedelta(seconds=30))
    if sys.argv[2] == "bad":
        bad(sys.argv[1])
    else:
        kill()
    dist.destroy_process_group()
