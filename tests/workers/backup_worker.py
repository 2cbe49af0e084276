"""Backup workers on 4 real ranks (mpiexec, or gloo ranks spawned by the test).

    backup_worker.py BACKEND SCENARIO OUTDIR [BACKUPS]

Scenarios (each rank writes OUTDIR/<case>_rank<r>.json and .pt):

* ``slow``: rank 3 sleeps ``SLOW_S`` before every backward, the others
  ``FAST_S`` (their compute); a rank stops once a step says training has
  ended. Case ``exact``:
  a linear loss whose gradients are integers (multiples of N), distinct per
  rank and global step, SGD with momentum (lr 0.5, momentum 0.5), so every
  update is exact and the test can replay it; case ``adam``: an MLP on
  random data, Adam. Fast ranks record their step times.
* ``random``: before every backward, one rank drawn at random (seeded per
  step) sleeps an exponential delay; SGD with momentum on an MLP.
* ``dead``: rank 3 kills itself (SIGKILL) before its backward at step
  ``DIE_AT`` (on NCCL once the snapshots it answered with have reached
  their late ranks: :func:`finish_serving`); the others record the report,
  or the error and when it came.
* ``killclose``: like ``dead`` with the default ``dead_after_s``, but the
  others close right after step ``DIE_AT`` (while rank 3 is freshly dead);
  each records when its ``close()`` began and returned.
* ``paused``: rank 3 stops itself (SIGSTOP) before its backward at step
  ``DIE_AT`` for ``PAUSE_S``, longer than ``dead_after_s``; a helper
  process wakes it (SIGCONT). The others finish and close; rank 3 finds
  itself declared dead and records the error.
* ``ready``: like ``random``, with catch-up sends started only after the
  late rank posted its receive (the path stream-ordered transports take).
"""

import json
import os
import signal
import subprocess
import sys
import time

import torch

import commrt
from commrt.algorithms import BackupWorkers

SLOW_S = 1.0
FAST_S = 0.15
SLOW_STEPS = 10
RANDOM_STEPS = 12
DEAD_STEPS = 10
DIE_AT = 3
PAUSE_S = 5.0


def linear_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 6))


def targets(model, rank, g, n):
    """Integer gradients, multiples of n (so scaling by 1/n is exact), distinct per rank and
    global step."""
    return [
        torch.full_like(p, float(n * ((rank + 1) * (g + 2) + i)))
        for i, p in enumerate(model.parameters())
    ]


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def state_of(model, opt):
    out = {f"param/{n}": p.detach().clone() for n, p in model.named_parameters()}
    for i, p in enumerate(model.parameters()):
        for k, v in opt.state.get(p, {}).items():
            out[f"state/{i}/{k}"] = v.detach().clone() if torch.is_tensor(v) else torch.tensor(v)
    return out


def finish_serving(server, timeout):
    """Let the snapshots this rank answered with reach their late ranks. On NCCL, which
    cannot cancel a receive, a server that dies between answering and sending costs its
    late rank the communicator (tests/multiprocess/test_nccl_strict.py, ``serverdies``): there the
    ``dead`` scenario is a death between steps with nothing on the way."""
    deadline = time.monotonic() + timeout
    while server.busy and time.monotonic() < deadline:
        server.progress()
        time.sleep(0.005)


def run_case(comm, case, out, algorithm, make_opt, model, backward, delay, die_at=None):
    rank = comm.rank
    opt = make_opt(model)
    rec = {"rank": rank, "case": case, "steps": [], "applied": [], "step_s": []}
    steps = {
        "exact": SLOW_STEPS,
        "adam": SLOW_STEPS,
        "random": RANDOM_STEPS,
        "ready": RANDOM_STEPS,
        "dead": DEAD_STEPS,
        "killclose": DIE_AT + 1,
        "paused": DEAD_STEPS,
    }[case]
    sync = commrt.GradientSync(
        model, comm, algorithm=algorithm, bucket_mb=0.004, first_bucket_mb=0.001
    )
    if case == "ready":
        sync.policy.send_when_ready = True
    rec["buckets"] = len(sync.buckets)
    rec["labels"] = list(sync.stats.algorithms)
    try:
        t_last = time.perf_counter()
        for it in range(steps):
            if die_at is not None and it == die_at and rank == comm.world_size - 1:
                if comm.transport.traits.stream_ordered:
                    finish_serving(sync.policy.parts.catchup.server, comm.timeout)
                with open(os.path.join(out, "died_at.txt"), "w") as f:
                    f.write(repr(time.time()))
                if case == "paused":  # a helper wakes this rank after PAUSE_S
                    wake = f"sleep {PAUSE_S}; kill -CONT {os.getpid()}"
                    subprocess.Popen(["sh", "-c", wake])
                    os.kill(os.getpid(), signal.SIGSTOP)
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(delay(rank, it))
            g = sync.global_step
            backward(model, rank, g, it)
            rec["applied"].append(sync.step(opt))
            now = time.perf_counter()
            rec["step_s"].append(now - t_last)
            t_last = now
            rec["steps"].append(dict(sync.stats.last.extra, computed_at=g))
            if sync.policy.finished:
                break  # training ended (another rank closed): nothing left to do
        rec["close_began"] = time.time()
        sync.close()
        rec["close_ended"] = time.time()
    except commrt.CommError as e:  # a timeout, or this rank was declared dead
        rec["error"] = str(e)
        rec["error_type"] = type(e).__name__
        rec["error_at"] = time.time()
        sync.close()
    rep = sync.policy.report()
    rec.update(
        global_step=sync.global_step,
        final=rep.final_step,
        missing=list(rep.missing),
        dropped={str(k): v for k, v in rep.dropped.items()},
        updates={str(k): v for k, v in rep.updates.items()},
    )
    torch.save(state_of(model, opt), os.path.join(out, f"{case}_rank{rank}.pt"))
    with open(os.path.join(out, f"{case}_rank{rank}.json"), "w") as f:
        json.dump(rec, f)


def make_comm(backend, timeout):
    """``nccl-strict``: the NCCL adapter over the strict stand-in (tests/helpers/nccl_strict.py)."""
    if backend != "nccl-strict":
        return commrt.init(backend, timeout=timeout, abort_on_error=False)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers.engines import init_with
    from helpers.nccl_strict import StrictNccl

    return init_with(
        "nccl", StrictNccl(hang_s=2 * timeout), device="cpu", timeout=timeout, abort_on_error=False
    )


def main(backend, scenario, out, backups=1):
    timeout = 6.0 if scenario == "dead" else 20.0 if backend == "nccl-strict" else 60.0
    comm = make_comm(backend, timeout)
    n = comm.world_size - int(backups)
    if scenario in ("killclose", "paused"):
        alg = BackupWorkers(backups=int(backups))  # the default dead_after_s
    else:
        alg = BackupWorkers(backups=int(backups), dead_after_s=2.0 if scenario == "dead" else 10.0)

    def linear_backward(model, r, g, it):
        loss = sum((p * t).sum() for p, t in zip(model.parameters(), targets(model, r, g, n)))
        loss.backward()

    def data_backward(model, r, g, it):
        gen = torch.Generator().manual_seed(1000 * r + it)
        x = torch.randn(32, 16, generator=gen)
        y = torch.randint(0, 4, (32,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    def slow(r, it):
        return SLOW_S if r == comm.world_size - 1 else FAST_S

    def random_delay(r, it):
        gen = torch.Generator().manual_seed(77 + it)  # the same draw on every rank
        who = int(torch.randint(0, comm.world_size, (1,), generator=gen))
        return float(torch.empty(1).exponential_(1 / 0.04, generator=gen)) if r == who else 0.0

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.5)

    def momentum(m):
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    if scenario == "slow":
        run_case(comm, "exact", out, alg, sgd, linear_model(), linear_backward, slow)
        run_case(
            comm,
            "adam",
            out,
            alg,
            lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
            mlp(),
            data_backward,
            slow,
        )
    elif scenario in ("random", "ready"):
        run_case(comm, scenario, out, alg, momentum, mlp(), data_backward, random_delay)
    elif scenario in ("dead", "killclose", "paused"):
        run_case(
            comm,
            scenario,
            out,
            alg,
            momentum,
            mlp(),
            data_backward,
            lambda r, it: 0.02,
            die_at=DIE_AT,
        )
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    if scenario not in ("dead", "killclose", "paused"):
        comm.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
