"""The GradientSync seam: algorithm families defined in this file only.

Two families that commrt does not ship run through GradientSync on 2 real
ranks (this file re-runs itself under ``mpiexec -n 2``), with no file under
``commrt/`` knowing about them:

* ``SumAll`` sums gradients instead of averaging them (scale 1, a ring);
* ``Stale`` uses every hook: a per-step scale (1, 1/2, 1/4, ...), a
  decision in ``begin_step``, and an exchange that runs in ``after_step``,
  after ``wait()`` has returned, so the gradient applied at step t is the
  sum of step t-1's scaled gradients (nothing at step 0). Collectives issued
  between steps must wait for that exchange.

Gradients are small integers times powers of two, so every expected value
is exact and the checks use ``torch.equal``.
"""

import json
import os
import re
import sys
from dataclasses import dataclass

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 5


def _policy_types():
    # imported lazily so the grep test needs no commrt import
    from commrt.algorithms import Algorithm, Ring
    from commrt.sync import Policy

    @dataclass(frozen=True)
    class SumAll(Algorithm):
        name = "test-sum"

        def schedule(self, world_size, ranks=None, collective=None):
            return Ring().schedule(world_size, ranks)

        def sync_policy(self):
            return SumPolicy(self)

    class SumPolicy(Policy):
        def setup(self, ctx):
            self.ctx = ctx
            self.schedules = [self.algorithm.schedule(ctx.comm.world_size) for _ in ctx.buckets]
            return tuple(f"sum:{s.name}" for s in self.schedules)

        def communicate(self, step, bucket, buf):
            return self.ctx.run(self.schedules[bucket], buf, bucket)

    @dataclass(frozen=True)
    class Stale(Algorithm):
        name = "test-stale"

        def schedule(self, world_size, ranks=None, collective=None):
            return Ring().schedule(world_size, ranks)

        def sync_policy(self):
            return StalePolicy(self)

    class StalePolicy(Policy):
        def setup(self, ctx):
            self.ctx = ctx
            self.log = []
            self.schedule = self.algorithm.schedule(ctx.comm.world_size)
            self.wire = [torch.zeros_like(b) for b in ctx.buffers]  # on the wire after wait()
            self.prev = [torch.zeros_like(b) for b in ctx.buffers]  # last step's sum, applied now
            return tuple("stale" for _ in ctx.buckets)

        def begin_step(self, step):
            self.log.append(("begin", step))

        def scale(self, step):
            return 2.0 ** -(step % 3)

        def communicate(self, step, bucket, buf):
            self.log.append(("bucket", step, bucket))
            self.wire[bucket].copy_(buf)
            buf.copy_(self.prev[bucket])
            return 0

        def after_step(self, step):
            self.log.append(("after", step))
            sent = 0
            for b, w in enumerate(self.wire):
                sent += self.ctx.run(self.schedule, w, b)
                self.prev[b].copy_(w)
            return sent

        def apply(self, optimizer):
            # step 0 has nothing to apply yet: its exchange is still on the wire
            self.applies = getattr(self, "applies", 0) + 1
            if self.applies == 1:
                return 0
            optimizer.step()
            return 1

        def step_stats(self):
            return {"stale_steps": sum(1 for e in self.log if e[0] == "after")}

        @property
        def extra_bytes(self):
            return sum(2 * w.numel() * w.element_size() for w in self.wire)

        def close(self):
            self.log.append(("close",))

    return SumAll, Stale


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(40, 300), torch.nn.Linear(300, 70), torch.nn.Linear(70, 5)
    )


def targets(m, rank, step):
    """Integer gradients, distinct per rank, step and parameter."""
    return [
        torch.full_like(p, float((rank + 1) * (step + 2) + i)) for i, p in enumerate(m.parameters())
    ]


def backward(m, rank, step):
    loss = sum((p * t).sum() for p, t in zip(m.parameters(), targets(m, rank, step)))
    loss.backward()


def worker(out):
    from mpi4py import MPI

    import commrt

    SumAll, Stale = _policy_types()
    world = MPI.COMM_WORLD
    comm = commrt.init("mpi", timeout=30)
    rank, p = comm.rank, comm.world_size
    report = {"rank": rank, "sum": [], "stale": [], "applied": []}

    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    with commrt.GradientSync(
        m, comm, algorithm=SumAll(), bucket_mb=0.02, first_bucket_mb=0.005
    ) as sync:
        report["sum_labels"] = list(sync.stats.algorithms)
        for s in range(STEPS):
            backward(m, rank, s)
            report["applied"].append(("sum", sync.step(opt, zero_grad=False)))
            want = [
                sum(targets(m, r, s)[i] for r in range(p)) for i in range(len(list(m.parameters())))
            ]
            report["sum"].append(all(torch.equal(q.grad, w) for q, w in zip(m.parameters(), want)))
            opt.zero_grad(set_to_none=False)
        report["sum_buckets"] = len(sync.buckets)

    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    sync = commrt.GradientSync(m, comm, algorithm=Stale(), bucket_mb=0.02, first_bucket_mb=0.005)
    nparams = len(list(m.parameters()))
    between = []
    for s in range(STEPS):
        backward(m, rank, s)
        report["applied"].append(("stale", sync.step(opt, zero_grad=False)))
        if s == 0:
            want = [torch.zeros_like(q) for q in m.parameters()]
        else:
            scale = 2.0 ** -((s - 1) % 3)
            want = [sum(targets(m, r, s - 1)[i] * scale for r in range(p)) for i in range(nparams)]
        report["stale"].append(all(torch.equal(q.grad, w) for q, w in zip(m.parameters(), want)))
        opt.zero_grad(set_to_none=False)
        # a collective right after wait(): it must run after this step's after_step exchange
        t = torch.full((1000,), float(rank + 1))
        commrt.all_reduce(t, comm, op="sum")
        between.append(bool(torch.all(t == p * (p + 1) / 2)))
    report["between"] = between
    log = sync.policy.log
    report["extra_bytes"] = sync.stats.buffer_bytes >= sync.policy.extra_bytes > 0
    report["stats_extra"] = sync.stats.last.extra
    sync.close()
    report["log"] = log
    report["stale_buckets"] = len(sync.buckets)
    comm.close()
    rows = world.gather(report, root=0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


@pytest.mark.mpi
def test_families_defined_outside_commrt_run_through_gradient_sync(tmp_path):
    from helpers.mp import mpiexec

    out = tmp_path / "seam.json"
    mpiexec(2, os.path.join("..", "multiprocess", os.path.basename(__file__)), out, timeout=240)
    rows = json.loads(out.read_text())
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert r["sum_buckets"] >= 3 and r["stale_buckets"] >= 3
        assert r["sum_labels"] == ["sum:ring"] * r["sum_buckets"]
        assert r["sum"] == [True] * STEPS, "sum family: gradients are not the exact sum over ranks"
        assert r["stale"] == [True] * STEPS, (
            "stale family: gradient at t is not step t-1's exact sum"
        )
        assert r["between"] == [True] * STEPS
        assert [a for f, a in r["applied"] if f == "sum"] == [1] * STEPS
        assert [a for f, a in r["applied"] if f == "stale"] == [0] + [1] * (STEPS - 1)
        assert r["extra_bytes"], "the policy's own buffers are missing from stats.buffer_bytes"
        # the last step's after_step may or may not have finished when its stats were taken
        assert r["stats_extra"]["stale_steps"] in (STEPS - 1, STEPS)
        nb = r["stale_buckets"]
        want = []
        for s in range(STEPS):
            want += [["begin", s]] + [["bucket", s, b] for b in range(nb)] + [["after", s]]
        assert r["log"] == want + [["close"]], "hooks ran out of order"


def test_gradsync_knows_no_family():
    """GradientSync must stay family-agnostic: no schedule selection, no 1/p
    scaling and no algorithm name in its module (they live behind the seam)."""
    path = os.path.join(ROOT, "commrt", "sync", "gradsync.py")
    text = open(path).read()
    from commrt.algorithms import NAMES

    forbidden = [
        r"\bselect\b",
        r"\bschedules?\b\s*\[",
        r"1(\.0*)?\s*/\s*[\w.]*world_size",
        r"/\s*[\w.]*world_size",
        r"executor\.run",
    ]
    forbidden += [rf"\b{re.escape(n)}\b" for n in NAMES]
    forbidden += [r"\bgossip\b", r"\bbackup\b", r"\bring\b", r"\btorus", r"\bhalving"]
    hits = [(pat, m.group(0)) for pat in forbidden for m in re.finditer(pat, text, re.IGNORECASE)]
    assert hits == [], f"gradsync.py refers to a family or schedule: {hits}"


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    worker(sys.argv[1])
