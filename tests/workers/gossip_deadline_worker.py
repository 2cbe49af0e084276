"""A gloo rank of gossip with a deadline, for the exact-accounting tests.

    gossip_deadline_worker.py OUT_DIR MODE STEPS [KILL_STEP]

Every rank computes integer-valued gradients (distinct per rank, step and
element) on a model whose learning rate is 0, so the gradients stay exact.
Before each step a rank sleeps a random delay drawn per (rank, step): mostly
none, sometimes several deadlines long. ``MODE``: ``sync``, ``async``
(asynchronous gossip), ``dissemination`` or ``kill`` (real training steps with
lr > 0; rank 1 kills itself with SIGKILL at step KILL_STEP).

Each rank saves OUT_DIR/rank<r>.pt: the float64 sums (in parameter layout) of
what it computed, what ``wait()`` left in ``.grad`` (applied), what the
policy held unapplied at close, its ledger and, for ``kill``, its parameters.
"""

import os
import random
import signal
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.gossip import gossip_model, gossip_targets  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import Gossip  # noqa: E402

DEADLINE_S = 0.05


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])


def unapplied(sync, model) -> torch.Tensor:
    """The ledger's unapplied sums, from bucket layout to parameter layout."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    out = [torch.zeros(p.numel(), dtype=torch.float64) for p in model.parameters()]
    for bucket, held in zip(sync.buckets, sync.policy.ledger.unapplied_buckets):
        for p, off in zip(bucket.params, bucket.offsets):
            out[index[id(p)]] += held[off : off + p.numel()]
    return torch.cat(out)


def delay(rank: int, step: int) -> float:
    r = random.Random(rank * 7919 + step)
    return r.choice([0.0] * 6 + [2 * DEADLINE_S, 5 * DEADLINE_S])


def main(out_dir: str, mode: str, steps: int, kill_step: int = -1) -> None:
    comm = commrt.init("gloo", timeout=120)
    alg = Gossip(
        topology="dissemination" if mode == "dissemination" else "hypercube",
        rotate=True,
        seed=5,
        asynchronous=mode == "async",
        deadline_s=DEADLINE_S,
    )
    model = gossip_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4 if mode == "kill" else 0.0)
    computed = torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float64)
    applied = torch.zeros_like(computed)
    sync = commrt.GradientSync(model, comm, algorithm=alg, bucket_mb=0.02, first_bucket_mb=0.005)
    for s in range(steps):
        if comm.rank == 1 and s == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(delay(comm.rank, s))
        targets = gossip_targets(model, comm.rank, s)
        sum((q * t).sum() for q, t in zip(model.parameters(), targets)).backward()
        sync.step(opt, zero_grad=False)
        computed += flat(targets)
        applied += flat(p.grad for p in model.parameters())
        opt.zero_grad(set_to_none=False)
    sync.close()
    torch.save(
        {
            "computed": computed,
            "applied": applied,
            "unapplied": unapplied(sync, model),
            "ledger": sync.policy.ledger.as_dict(),
            "params": flat(p.detach() for p in model.parameters()),
        },
        os.path.join(out_dir, f"rank{comm.rank}.pt"),
    )
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(int, sys.argv[4:]))
