"""The DDP comparison shared by the GradientSync workers (mpiexec and multi-host).

The same model, data and seed train under PyTorch DDP (gloo) and under
GradientSync; :func:`rel_err` compares the parameters per tensor:
max|commrt - ddp| / max|ddp|. ``torch.distributed`` must be initialised
(gloo) before :func:`train_ddp`.
"""

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import commrt

STEPS = 20


class Net(torch.nn.Module):
    def __init__(self, extra=False, branch=False):
        super().__init__()
        self.a = torch.nn.Linear(37, 300)
        self.b = torch.nn.Linear(300, 129)
        if branch:
            self.branch = torch.nn.Linear(129, 129)  # used only when asked to
        self.c = torch.nn.Linear(129, 10)
        if extra:
            self.d = torch.nn.Linear(10, 10)

    def forward(self, x, use_branch=False):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        if use_branch:
            h = h + self.branch(h)
        return self.c(h)


def batch(rank, step, k=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + k)
    return torch.randn(16, 37, generator=g), torch.randint(0, 10, (16,), generator=g)


def fresh(branch=False, seed=7):
    torch.manual_seed(seed)
    return Net(branch=branch)


def rel_err(m1, m2):
    return max(
        ((a - b).abs().max() / b.abs().max()).item()
        for a, b in zip(m1.parameters(), m2.parameters())
    )


def _train(forward, no_sync, step, rank, accumulate, steps):
    """The same data in the same order for both engines: an optional accumulated
    micro-batch under ``no_sync``, then one synchronised backward and ``step``."""
    for s in range(steps):
        if accumulate:
            with no_sync():
                x, y = batch(rank, s, 1)
                torch.nn.functional.cross_entropy(forward(x), y).backward()
        x, y = batch(rank, s)
        torch.nn.functional.cross_entropy(forward(x), y).backward()
        step()


def train_ddp(rank, accumulate, steps=STEPS):
    model = fresh()
    ddp = DDP(model, bucket_cap_mb=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step():
        opt.step()
        opt.zero_grad()

    _train(ddp, ddp.no_sync, step, rank, accumulate, steps)
    return model


def train_commrt(comm, rank, accumulate, seed=7, steps=STEPS, **kw):
    model = fresh(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with commrt.GradientSync(model, comm, bucket_mb=0.05, first_bucket_mb=0.01, **kw) as sync:
        _train(model, sync.no_sync, lambda: sync.step(opt), rank, accumulate, steps)
        nbuckets = len(sync.buckets)
    return model, nbuckets
