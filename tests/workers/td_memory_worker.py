"""Memory held across reduce_scatter_tensor calls on fresh inputs, on one backend.

Launched torchrun-style; argv[1] is the backend ("commrt" or "gloo"), argv[2] the
report path. Each call reduces a fresh 32 MB input into a fresh output and drops
both, as FSDP does with its unsharded gradients, so nothing the caller holds
grows. Rank 0 writes {"backend", "growth_mb": [...], "calls"} to argv[2]: each
rank's resident memory after the calls, less that after the first call (which
makes the caches, scratch and buffers a steady state needs).
"""

import json
import sys

import torch
import torch.distributed as dist

import commrt  # noqa: F401  (registers the "commrt" backend)

CALLS, NUMEL = 40, 8 << 20  # 8 M float32 elements: 32 MB


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main(backend: str, path: str) -> None:
    dist.init_process_group(backend)
    rank, p = dist.get_rank(), dist.get_world_size()
    expect = torch.zeros(NUMEL // p)
    for k in range(CALLS):
        inp = torch.full((NUMEL,), float(k + rank))
        out = torch.empty(NUMEL // p)
        dist.reduce_scatter_tensor(out, inp)
        torch.full((NUMEL // p,), float(p * k + sum(range(p))), out=expect)
        assert torch.equal(out, expect), f"call {k}: wrong sum"
        del inp, out
        if k == 0:
            base = rss_mb()
    growth = torch.tensor([rss_mb() - base], dtype=torch.float64)
    every = [torch.zeros_like(growth) for _ in range(p)]
    dist.all_gather(every, growth)
    if rank == 0:
        report = {"backend": backend, "calls": CALLS, "growth_mb": [float(g) for g in every]}
        with open(path, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
