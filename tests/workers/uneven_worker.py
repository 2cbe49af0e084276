"""Ranks that run different numbers of steps: rank r runs ``steps + r``.

    uneven_worker.py BACKEND MODE LOOP STEPS OUT_DIR

``MODE``: ``close`` (the rank out of steps closes its communicator and stays
alive a while), ``exit`` (it returns from main without closing: the interpreter
exits), ``idle`` (it closes, then the others wait a moment before their next
call, so nobody is waiting when it leaves), or ``join`` (every rank wraps its loop
in ``GradientSync.join``). ``LOOP``: ``allreduce`` (plain ``commrt.all_reduce`` per
step) or ``gradsync`` (a GradientSync training loop).

Each rank writes ``OUT_DIR/rank<r>.json``: the steps it ran, and for a rank that
raised, the error's type, text and ``waited_s``: the seconds from the later of
the other rank leaving (read from a file it wrote) and this rank's last call
starting, to the error. ``join`` also writes the final
parameters and the float64 reference (see :func:`reference`).
"""

import os
import sys
import time

import torch

import commrt

FEATURES, SAMPLES = 6, 4


def shard(rank: int, steps: int):
    """``steps + rank`` batches of this rank's own data (the same on every run)."""
    g = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(SAMPLES, FEATURES, generator=g), torch.randn(SAMPLES, 1, generator=g))
        for _ in range(steps + rank)
    ]


def model():
    """The same model on every rank and thread (its own generator, not the global seed)."""
    m = torch.nn.Sequential(torch.nn.Linear(FEATURES, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return m


def loss(m, batch):
    x, y = batch
    dtype = next(m.parameters()).dtype
    return torch.nn.functional.mse_loss(m(x.to(dtype)), y.to(dtype))


def reference(world_size: int, steps: int, lr: float, over_all: bool = False):
    """Plain SGD in float64 where step t's gradient is the mean over the ranks that still
    have a batch t: what join must compute (``over_all``: divided by the world size
    instead, the wrong answer a test must be able to tell apart)."""
    m = model().double()
    shards = [shard(r, steps) for r in range(world_size)]
    for t in range(steps + world_size - 1):
        grads = None
        live = [s[t] for s in shards if t < len(s)]
        for batch in live:
            m.zero_grad()
            loss(m, batch).backward()
            g = [p.grad.clone() for p in m.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        with torch.no_grad():
            for p, g in zip(m.parameters(), grads):
                p -= lr * g / (world_size if over_all else len(live))
    return m


def flat(m) -> list[float]:
    return torch.cat([p.detach().flatten() for p in m.parameters()]).tolist()


#: time.time() when this rank's latest call (or step) began
STARTED = [0.0]


def run(comm, mode, loop, steps, out):
    """This rank's loop; returns how many steps it ran."""
    mine = shard(comm.rank, steps)
    if loop == "allreduce":
        t = torch.ones(1000)
        for i, _ in enumerate(mine):
            STARTED[0] = time.time()
            commrt.all_reduce(t, comm, op="avg")
            if mode == "idle" and i == len(mine) - 2 and comm.rank > 0:
                time.sleep(2.0)  # rank 0 leaves while this rank computes
        return len(mine)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sync = commrt.GradientSync(m, comm, bucket_mb=1e-4, first_bucket_mb=1e-4)
    if mode == "join":
        with sync.join(opt):
            for batch in mine:
                loss(m, batch).backward()
                sync.step(opt)
        out["params"] = flat(m)
        out["reference"] = flat(reference(comm.world_size, steps, 0.1))
        out["over_all_ranks"] = flat(reference(comm.world_size, steps, 0.1, over_all=True))
        return len(mine)
    for i, batch in enumerate(mine):
        STARTED[0] = time.time()
        loss(m, batch).backward()
        sync.step(opt)
        if mode == "idle" and i == len(mine) - 2 and comm.rank > 0:
            time.sleep(2.0)
    return len(mine)


def leave(out_dir, world_size) -> None:
    from leaving import leave_when_written  # this script's folder (tests import the module)

    leave_when_written([os.path.join(out_dir, f"rank{r}.json") for r in range(world_size)])


def main(backend, mode, loop, steps, out_dir):
    steps = int(steps)
    comm = commrt.init(backend, timeout=60, abort_on_error=False)
    out = {"rank": comm.rank}
    left_file = os.path.join(out_dir, "left")
    try:
        out["steps"] = run(comm, mode, loop, steps, out)
    except commrt.CommError as e:
        now = time.time()
        left_at = float(open(left_file).read()) if os.path.exists(left_file) else None
        out.update(error=type(e).__name__, message=str(e))
        out["waited_s"] = None if left_at is None else now - max(left_at, STARTED[0])

    from leaving import write_report

    def write():
        write_report(os.path.join(out_dir, f"rank{comm.rank}.json"), out)

    if "error" in out or mode == "join":
        write()
        comm.close()
        leave(out_dir, comm.world_size)
    write()
    with open(left_file + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(left_file + ".tmp", left_file)
    if mode == "exit":
        return 0  # the interpreter exits with the communicator open
    comm.close()
    time.sleep(4)  # alive, but gone from the communicator
    leave(out_dir, comm.world_size)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
