"""A gloo rank of gossip with a deadline, for the exact-accounting tests.

    gossip_deadline_worker.py OUT_DIR MODE STEPS [KILL_AFTER_MS]

Every rank computes integer-valued gradients (distinct per rank, step and
element) on a model whose learning rate is 0, so the gradients stay exact.
Before each step a rank sleeps a random delay drawn per (rank, step): mostly
none, sometimes several deadlines long. ``MODE``: ``sync``, ``mpi`` (sync, over
MPI: run under mpiexec), ``cuda_ipc`` (sync, over ``cuda_ipc`` on the strict CPU
stand-in device, slots of 4 KiB: every message spans several), ``async`` (asynchronous gossip), ``dissemination``, ``kill`` (training steps with lr > 0;
rank 1 kills itself with SIGKILL KILL_AFTER_MS after it started its first step,
wherever it is then) or ``plain`` (the same training with plain gossip: no
deadline, no delays, no death, the reference for the disagreement).

Each rank saves OUT_DIR/rank<r>.pt: the float64 sums (in parameter layout) of
what it computed, what ``wait()`` left in ``.grad`` (applied), what the
policy held unapplied at close, its ledger and, for ``kill``, its parameters.
"""

import os
import random
import signal
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.engines import init_with  # noqa: E402
from helpers.gossip import gossip_model, gossip_targets  # noqa: E402
from helpers.ipc_standin import StandInDevice  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import Gossip  # noqa: E402

DEADLINE_S = 0.05
#: the learning rate of the training modes (kill, plain)
LR = 1e-4


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


def connect(mode: str) -> commrt.Communicator:
    """The mode's communicator: MPI, ``cuda_ipc`` on the stand-in device, or gloo."""
    if mode == "cuda_ipc":
        os.environ["COMMRT_CUDA_IPC_SLOT_BYTES"] = "4096"
        dev = StandInDevice(seed=int(os.environ["RANK"]))
        return init_with("cuda_ipc", dev, timeout=120, stall_s=0)
    return commrt.init("mpi" if mode == "mpi" else "gloo", timeout=120)


def main(out_dir: str, mode: str, steps: int, kill_after_ms: int = -1) -> None:
    comm = connect(mode)
    alg = Gossip(
        topology="dissemination" if mode == "dissemination" else "hypercube",
        rotate=True,
        seed=5,
        asynchronous=mode == "async",
        deadline_s=None if mode == "plain" else DEADLINE_S,
    )
    model = gossip_model()
    training = mode in ("kill", "plain")
    opt = torch.optim.SGD(model.parameters(), lr=LR if training else 0.0)
    computed = torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float64)
    applied = torch.zeros_like(computed)
    sync = commrt.GradientSync(model, comm, algorithm=alg, bucket_mb=0.02, first_bucket_mb=0.005)
    if comm.rank == 1 and kill_after_ms >= 0:
        kill = threading.Timer(kill_after_ms / 1000, os.kill, (os.getpid(), signal.SIGKILL))
        kill.daemon = True
        kill.start()
    for s in range(steps):
        time.sleep(0.0 if mode == "plain" else delay(comm.rank, s))
        targets = gossip_targets(model, comm.rank, s)
        sum((q * t).sum() for q, t in zip(model.parameters(), targets)).backward()
        sync.step(opt, zero_grad=False)
        computed += flat(targets)
        applied += flat(p.grad for p in model.parameters())
        opt.zero_grad(set_to_none=False)
    sync.close()
    ledger = sync.policy.ledger.as_dict() if alg.deadline_s is not None else {}
    torch.save(
        {
            "computed": computed,
            "applied": applied,
            "unapplied": unapplied(sync, model) if ledger else None,
            "ledger": ledger,
            "params": flat(p.detach() for p in model.parameters()),
            "deaths": dict(sync.policy.deaths.learned) if ledger else {},
        },
        os.path.join(out_dir, f"rank{comm.rank}.pt"),
    )
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(int, sys.argv[4:]))
