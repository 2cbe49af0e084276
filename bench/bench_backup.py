"""Backup workers on one machine: time to a fixed number of global steps, and accuracy.

4 gloo ranks train the digits MLP (``commrt train``) with a long-tailed
delay every rank draws before every step (Pareto, mean ``MEAN_DELAY_S``,
shape 2: most steps are fast, a few are very slow), for b = 0 (plain
synchronous SGD through the same machinery), 1 and 2 backups. Each run
ends after the same number of global steps (``EPOCHS`` epochs of the first
closer); reported: wall time, time per global step, final test accuracy,
dropped gradients. From the repository root, after
``pip install -e '.[dev]'``, as a script for the table::

    python bench/bench_backup.py                    # 3 runs per b; or:
    python bench/bench_backup.py 1                  # quick: 1 run per b
    pytest bench/bench_backup.py --benchmark-only

Fewer gradients per step (N = 4 - b) also means a smaller effective batch
(N × 16 samples), which the accuracy column shows alongside the time.
"""

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

EPOCHS = 3
MEAN_DELAY_S = 0.03
STRAGGLER = f"pareto:{MEAN_DELAY_S}:2"
REPEATS = 3


def run_train(backups: int, seed: int = 0) -> dict:
    """One ``commrt train`` job of 4 gloo ranks with ``backups`` backup workers: its numbers."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE")
    }
    cmd = [
        sys.executable,
        "-m",
        "commrt",
        "train",
        "--nproc",
        "4",
        "--backend",
        "gloo",
        "--algorithm",
        "backup",
        "--backups",
        str(backups),
        "--epochs",
        str(EPOCHS),
        "--straggler",
        STRAGGLER,
        "--seed",
        str(seed),
        "--quiet",
        "--timeout",
        "60",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = {
        m.group(1): m.group(2)
        for m in (re.match(r"^(\S.*?)\s{2,}(.+)$", ln) for ln in proc.stdout.splitlines())
        if m
    }
    wall = float(rows["training"].split()[0])  # "12.34 s (steps and evaluations)"
    steps = int(rows["global steps"])
    return {
        "backups": backups,
        "wall_s": wall,
        "step_ms": 1e3 * wall / steps,
        "steps": steps,
        "accuracy": float(rows["final test accuracy"]),
        "dropped": rows["dropped gradients"],
        "job_s": elapsed,
    }


@pytest.mark.parametrize("backups", [0, 1, 2])
def test_time_to_global_steps(benchmark, record_bandwidth, backups):
    out = benchmark.pedantic(run_train, args=(backups,), rounds=1, iterations=1)
    benchmark.extra_info.update(out)
    record_bandwidth(
        f"backup workers: 4 gloo ranks, {EPOCHS} epochs, delay {STRAGGLER} per rank and step",
        f"b={backups} (N={4 - backups})",
        "",
        steps=out["steps"],
        wall_s=out["wall_s"],
        step_ms=out["step_ms"],
        accuracy=out["accuracy"],
    )


def table(results: list[dict]) -> str:
    """Per b, the median run's steps, wall time and ms per step, the median accuracy and the
    last run's dropped gradients per rank: within 80 columns."""
    head = (
        f"{'b':>2} {'N':>2} {'steps':>6} {'wall s':>7} {'ms/step':>8} {'accuracy':>8}  "
        "dropped (last run)"
    )
    lines = [head, "-" * len(head)]
    for b in sorted({r["backups"] for r in results}):
        rs = sorted((r for r in results if r["backups"] == b), key=lambda r: r["wall_s"])
        mid = rs[len(rs) // 2]
        acc = sorted(r["accuracy"] for r in rs)[len(rs) // 2]
        line = (
            f"{b:>2} {4 - b:>2} {mid['steps']:>6} {mid['wall_s']:>7.2f} "
            f"{mid['step_ms']:>8.1f} {acc:>8.4f}  {rs[-1]['dropped']}"
        )
        lines.append(line if len(line) <= 80 else line[:79] + "…")
    return "\n".join(lines)


if __name__ == "__main__":
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else REPEATS
    results = []
    for rep in range(repeats):
        for b in (0, 1, 2):
            r = run_train(b, seed=rep)
            results.append(r)
            print(
                f"# b={b} seed={rep}: {r['steps']} steps, {r['wall_s']:.2f} s, "
                f"{r['step_ms']:.1f} ms/step, accuracy {r['accuracy']:.4f}",
                flush=True,
            )
    print()
    print(
        textwrap.fill(
            f"4 gloo ranks, digits MLP, {EPOCHS} epochs, delay per rank per step {STRAGGLER} "
            f"(mean {MEAN_DELAY_S * 1e3:g} ms); per b the median of {repeats} run{'s' * (repeats != 1)} "
            f"(seeds 0..{repeats - 1})",
            80,
        )
    )
    print(table(results))
