"""A small model, its targets and gossip steps, shared by the gossip tests and their workers."""

import torch

import commrt


def gossip_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(40, 300), torch.nn.Linear(300, 70), torch.nn.Linear(70, 5)
    )


def gossip_targets(m, rank, step):
    """Integer gradients, distinct per rank, step and parameter: every mix is exact."""
    return [
        torch.full_like(q, float((rank + 1) * (step + 2) + 7 * i))
        for i, q in enumerate(m.parameters())
    ]


def gossip_steps(comm, alg, steps=6):
    """GradientSync with ``alg``: per step (updates applied, grads == the expected mix)."""
    m = gossip_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    p, out = comm.world_size, []
    with commrt.GradientSync(m, comm, algorithm=alg, bucket_mb=0.02, first_bucket_mb=0.005) as sync:
        for s in range(steps):
            sum(
                (q * t).sum() for q, t in zip(m.parameters(), gossip_targets(m, comm.rank, s))
            ).backward()
            applied = sync.step(opt, zero_grad=False)
            t = s - 1 if alg.asynchronous else s  # async: step s applies step s-1's mix
            if t < 0:
                want = [torch.zeros_like(q) for q in m.parameters()]
            else:
                src = alg.peers(comm.rank, t, p)[1]
                want = [
                    (a + b) / 2 if p > 1 else a
                    for a, b in zip(gossip_targets(m, comm.rank, t), gossip_targets(m, src, t))
                ]
            out.append((applied, all(torch.equal(q.grad, w) for q, w in zip(m.parameters(), want))))
            opt.zero_grad(set_to_none=False)
        return out, len(sync.buckets), sync.stats


# ------------------------------------------------------------------------ shuffle
def shard(rank, n=24):
    """Samples that name themselves: x row i of rank r is (1000r + i) * [1, 2, 3]."""
    ids = torch.arange(n) + 1000 * rank
    return ids.double()[:, None] * torch.tensor([1.0, 2.0, 3.0]), ids


def run_shuffle(comm, overlap=True, epochs=4, **kw):
    x, y = shard(comm.rank)
    start = set(y.tolist())
    sh = commrt.data.GossipShuffle((x, y), comm, seed=2, overlap=overlap, **kw)
    batches = []
    for e in range(epochs):
        for xb, yb in sh.batches(5, e):
            assert torch.equal(
                xb, yb.double()[:, None] * torch.tensor([1.0, 2.0, 3.0])
            )  # rows stay whole
            batches.append(yb.tolist())
    x, y = sh.tensors
    return start, x.clone(), y.clone(), batches
