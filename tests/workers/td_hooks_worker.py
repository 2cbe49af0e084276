"""DDP communication hooks: GossipGraD and commrt all-reduce inside DDP.

Launched torchrun-style on 4 ranks; DDP runs on the "commrt" backend, the
hooks on a commrt communicator of their own (commrt.init("gloo")).

1. Gossip hook: parameters whose gradients are distinct integers per rank,
   parameter and iteration, in several DDP buckets; over 5 iterations (DDP
   rebuilds its buckets after the first) every gradient must equal
   ½ own + ½ that of Gossip.peers(rank, t)[1] exactly, and equal what
   GradientSync's gossip family gives on the same gradients.
2. average_parameters and GossipShuffle with a DDP model under the gossip
   hook: after training on shuffled batches the ranks' models differ, and
   average_parameters makes them equal.
3. All-reduce hook (ring, bf16 on the wire): gradients equal the average.
Rank 0 writes {"checks": n, "failures": [...], ...} to argv[1].
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commrt
from commrt.algorithms import Gossip
from commrt.distributed.hooks import AllReduceState, GossipState, allreduce_hook, gossip_hook

SIZES = (3000, 50000, 20000, 7)
STEPS = 5


class Ints(torch.nn.Module):
    """loss = Σ_i <p_i, c_i>: the gradient of p_i is exactly c_i."""

    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(n)) for n in SIZES)

    def forward(self, coefs):
        return sum((p * c).sum() for p, c in zip(self.ps, coefs))


def coefs(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randint(-1000, 1000, (n,), generator=g).float() for n in SIZES]


def gossip_phase(rank, p, comm, failures):
    gossip = Gossip(topology="hypercube", rotate=True, seed=3)
    model = Ints()
    ddp = DDP(model, bucket_cap_mb=0.1)
    state = GossipState(comm, gossip)
    ddp.register_comm_hook(state, gossip_hook)
    twin = Ints()
    sync = commrt.GradientSync(twin, comm, algorithm=gossip, bucket_mb=0.05)
    peers, checks = [], 0
    for t in range(STEPS):
        ddp(coefs(rank, t)).backward()
        peer = gossip.peers(rank, t, p)[1]
        peers.append(peer)
        mine, theirs = coefs(rank, t), coefs(peer, t)
        for i, prm in enumerate(model.ps):
            checks += 1
            if not torch.equal(prm.grad, mine[i] * 0.5 + theirs[i] * 0.5):
                failures.append(f"rank {rank} step {t} param {i}: not ½ own + ½ rank {peer}'s")
        twin(coefs(rank, t)).backward()
        sync.wait()
        for i, (a, b) in enumerate(zip(model.ps, twin.ps)):
            checks += 1
            if not torch.equal(a.grad, b.grad):
                failures.append(f"rank {rank} step {t} param {i}: hook != GradientSync gossip")
        model.zero_grad()
        twin.zero_grad()
        if sorted(s for s, _ in state.mixed.values()) != [t] * len(state.mixed):
            failures.append(f"rank {rank} step {t}: buckets mixed at steps {state.mixed}")
    sync.close()
    checks += 1
    if state.step != STEPS:
        failures.append(f"rank {rank}: the hook's counter reached {state.step}, not {STEPS}")
    return checks, peers, len(state.mixed)


def shuffle_phase(rank, p, comm, failures):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = DDP(model)
    ddp.register_comm_hook(GossipState(comm, Gossip(topology="dissemination")), gossip_hook)
    g = torch.Generator().manual_seed(rank)
    data = (torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    shard = commrt.data.GossipShuffle(data, comm, fraction=0.5, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in shard.batches(16, 0):
        torch.nn.functional.mse_loss(ddp(xb), yb).backward()
        opt.step()
        opt.zero_grad()
    disagreement = commrt.average_parameters(ddp.module, comm)
    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(p)]
    dist.all_gather(every, flat)
    if not all(torch.equal(e, every[0]) for e in every):
        failures.append(f"rank {rank}: models differ after average_parameters")
    return float(disagreement)


def allreduce_phase(rank, p, comm, failures):
    model = Ints()
    ddp = DDP(model, bucket_cap_mb=0.1)
    ddp.register_comm_hook(
        AllReduceState(comm, algorithm="ring", comm_dtype=torch.bfloat16), allreduce_hook
    )
    ddp(coefs(rank, 0)).backward()
    every = [coefs(r, 0) for r in range(p)]
    for i, prm in enumerate(model.ps):
        want = sum(c[i] for c in every) / p
        if not torch.allclose(prm.grad, want, rtol=0, atol=1000 * 2**-7):
            failures.append(f"rank {rank} param {i}: all-reduce hook != average")


def main(out):
    dist.init_process_group("commrt")
    rank, p = dist.get_rank(), dist.get_world_size()
    failures = []
    with commrt.init("gloo", timeout=120) as comm:
        checks, peers, buckets = gossip_phase(rank, p, comm, failures)
        disagreement = shuffle_phase(rank, p, comm, failures)
        allreduce_phase(rank, p, comm, failures)
    every = [None] * p
    dist.all_gather_object(every, (failures, peers))
    if rank == 0:
        report = {
            "checks": checks,
            "buckets": buckets,
            "disagreement": disagreement,
            "peers": [pe for _, pe in every],
            "failures": [f for fs, _ in every for f in fs],
        }
        with open(out, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
