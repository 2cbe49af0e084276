"""One rank delayed every step: who waits for it? Gossip with a deadline against plain
gossip, backup workers (b = 1) and the ring, on gloo ranks of one machine.

**Step time.** 8 gloo ranks run a GradientSync loop on a small MLP; each step
"computes" for ``COMPUTE_S`` (a sleep: on a machine with fewer cores than ranks
a busy loop would measure the scheduler, not the algorithm) plus a real
forward and backward; rank ``SLOW`` sleeps ``SLOW_FACTOR`` × ``COMPUTE_S`` more
every step. Reported per algorithm: the median step of the *other* ranks with
and without the delayed rank, and their ratio. Goal for the deadline: ≤ 1.25.

**Accuracy.** ``commrt train --nproc 8 --algorithm gossip`` with
``--gossip-deadline auto`` and ``--straggler SLOW:SECONDS`` against plain gossip
without a straggler (and the ring and backup b = 1 with the straggler), the mean
of ``SEEDS`` seeds. Goal: the deadline within 1 point of plain gossip.

From the repository root::

    python bench/bench_gossip_deadline.py          # both tables
    python bench/bench_gossip_deadline.py steps    # the step-time table only
    python bench/bench_gossip_deadline.py accuracy # the accuracy table only
    pytest bench/bench_gossip_deadline.py --benchmark-only
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import pytest

from commrt import settings

RANKS = 8
SLOW = RANKS - 1
COMPUTE_S = 0.02
SLOW_FACTOR = 10
STEPS = 40
SEEDS = 3
#: the algorithms compared, as --algorithm names (gossip-deadline: Gossip(deadline_s="auto"))
ALGORITHMS = ("ring", "backup", "gossip", "gossip-deadline")


def _algorithm(name: str):
    from commrt.algorithms import BackupWorkers, Gossip

    if name == "backup":
        return BackupWorkers(backups=1, inner="ring")
    if name.startswith("gossip"):
        return Gossip(deadline_s="auto" if name == "gossip-deadline" else None)
    return name


def worker(name: str, delayed: bool, out_dir: str) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_* in the environment): its step times as JSON."""
    import torch

    import commrt

    comm = commrt.init("gloo", timeout=120)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
    sync = commrt.GradientSync(model, comm, algorithm=_algorithm(name))
    times, last = [], time.perf_counter()
    for _ in range(STEPS):
        extra = SLOW_FACTOR * COMPUTE_S if delayed and comm.rank == SLOW else 0.0
        time.sleep(COMPUTE_S + extra)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        sync.step(opt)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    sync.close()
    with open(os.path.join(out_dir, f"{comm.rank}.json"), "w") as f:
        json.dump(times, f)
    comm.close()


def run_steps(name: str, delayed: bool) -> dict:
    """One job of RANKS gloo ranks: the median step of the ranks that are not delayed."""
    from commrt.runtime.store import host_store

    store = host_store()
    env = dict(
        os.environ,
        WORLD_SIZE=str(RANKS),
        LOCAL_WORLD_SIZE=str(RANKS),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port),
        TORCHELASTIC_USE_AGENT_STORE="true",
        OMP_NUM_THREADS="1",
    )
    env.pop(settings.STORE.name, None)
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, __file__, "worker", name, str(int(delayed)), out]
        procs = [
            subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
            for r in range(RANKS)
        ]
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            raise RuntimeError(f"{name}: ranks exited {codes}")
        steps = {r: json.load(open(os.path.join(out, f"{r}.json"))) for r in range(RANKS)}
    others = [t for r, ts in steps.items() if r != SLOW for t in ts[2:]]  # past warm-up
    return {"algorithm": name, "delayed": delayed, "median_s": statistics.median(others)}


def steps_table(rows: list[dict]) -> str:
    head = f"{'algorithm':<17}{'undelayed ms':>13}{'delayed ms':>12}{'ratio':>7}"
    lines = [head, "-" * len(head)]
    for name in ALGORITHMS:
        base = next(r["median_s"] for r in rows if r["algorithm"] == name and not r["delayed"])
        slow = next(r["median_s"] for r in rows if r["algorithm"] == name and r["delayed"])
        lines.append(f"{name:<17}{base * 1e3:>13.1f}{slow * 1e3:>12.1f}{slow / base:>7.2f}")
    return "\n".join(lines)


def run_train(name: str, straggler: bool, seed: int) -> float:
    """``commrt train`` on RANKS gloo ranks: the final test accuracy."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "PMI_RANK")}
    algorithm = "gossip" if name.startswith("gossip") else name
    cmd = [sys.executable, "-m", "commrt", "train", "--nproc", str(RANKS), "--backend", "gloo"]
    cmd += ["--algorithm", algorithm, "--seed", str(seed), "--quiet", "--timeout", "120"]
    if name == "gossip-deadline":
        cmd += ["--gossip-deadline", "auto"]
    if straggler:  # SLOW_FACTOR × a step's compute of this small MLP (a few ms)
        cmd += ["--straggler", f"{SLOW}:0.03"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return float(re.search(r"final test accuracy\s+([0-9.]+)", proc.stdout).group(1))


ACCURACY_RUNS = (
    ("gossip", False),
    ("gossip-deadline", True),
    ("gossip", True),
    ("backup", True),
    ("ring", True),
)


def accuracy_table() -> str:
    head = f"{'algorithm':<17}{'straggler':>10}{'accuracy (mean of ' + str(SEEDS) + ')':>24}"
    lines = [head, "-" * len(head)]
    for name, straggler in ACCURACY_RUNS:
        accs = [run_train(name, straggler, seed) for seed in range(SEEDS)]
        lines.append(
            f"{name:<17}{'yes' if straggler else 'no':>10}{statistics.mean(accs):>24.4f}"
            + f"  ({', '.join(f'{a:.4f}' for a in accs)})"
        )
        print(lines[-1], flush=True)
    return "\n".join(lines)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_other_ranks_step_with_one_rank_delayed(benchmark, record_bandwidth, name):
    out = benchmark.pedantic(lambda: run_steps(name, True), rounds=1, iterations=1)
    base = run_steps(name, False)
    record_bandwidth(
        f"{RANKS} gloo ranks, rank {SLOW} delayed {SLOW_FACTOR}x the compute every step",
        name,
        "",
        delayed_ms=out["median_s"] * 1e3,
        undelayed_ms=base["median_s"] * 1e3,
        ratio=out["median_s"] / base["median_s"],
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2], bool(int(sys.argv[3])), sys.argv[4])
        sys.exit(0)
    print(
        f"# {RANKS} gloo ranks, {COMPUTE_S * 1e3:g} ms compute per step, rank {SLOW} "
        f"{SLOW_FACTOR}x slower;\n# median step of the other ranks over {STEPS} steps",
        flush=True,
    )
    if sys.argv[1:2] != ["accuracy"]:
        rows = [run_steps(n, d) for n in ALGORITHMS for d in (False, True)]
        print(steps_table(rows), flush=True)
    if sys.argv[1:2] != ["steps"]:
        print(f"\n# commrt train --nproc {RANKS}, straggler: --straggler {SLOW}:0.03", flush=True)
        print(accuracy_table())
