"""Backup workers on one machine: time to a fixed number of global steps, and accuracy.

4 gloo ranks train the digits MLP (``commrt train``) with a long-tailed
delay every rank draws before every step (Pareto, mean ``MEAN_DELAY_S``,
shape 2: most steps are fast, a few are very slow), for b = 0 (plain
synchronous SGD through the same machinery), 1 and 2 backups. Each run
ends after the same number of global steps (``EPOCHS`` epochs of the first
closer); reported: wall time, time per global step, final test accuracy,
dropped gradients. Run as a script for the table::

    python bench/bench_backup.py                    # or:
    pytest bench/bench_backup.py --benchmark-only

Fewer gradients per step (N = 4 - b) also means a smaller effective batch
(N × 16 samples), which the accuracy column shows alongside the time.
"""

import os
import re
import subprocess
import sys
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
    wall = float(rows["wall time"].split()[0])
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
def test_time_to_global_steps(benchmark, backups):
    out = benchmark.pedantic(run_train, args=(backups,), rounds=1, iterations=1)
    benchmark.extra_info.update(out)


def table(results: list[dict]) -> str:
    head = (
        f"{'b':>2} {'N':>2} {'global steps':>12} {'wall s (median)':>16} {'ms / step':>10} "
        f"{'accuracy (median)':>18}  dropped gradients (last run)"
    )
    lines = [head, "-" * len(head)]
    for b in sorted({r["backups"] for r in results}):
        rs = sorted((r for r in results if r["backups"] == b), key=lambda r: r["wall_s"])
        mid = rs[len(rs) // 2]
        acc = sorted(r["accuracy"] for r in rs)[len(rs) // 2]
        lines.append(
            f"{b:>2} {4 - b:>2} {mid['steps']:>12} {mid['wall_s']:>16.2f} "
            f"{mid['step_ms']:>10.1f} {acc:>18.4f}  {rs[-1]['dropped']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    results = []
    for rep in range(REPEATS):
        for b in (0, 1, 2):
            results.append(run_train(b, seed=rep))
            print(f"# b={b} seed={rep}: {results[-1]}", flush=True)
    print(
        f"\n4 gloo ranks, digits MLP, {EPOCHS} epochs, delay per rank per step {STRAGGLER} "
        f"(mean {MEAN_DELAY_S * 1e3:g} ms), {REPEATS} runs each (seeds 0..{REPEATS - 1})"
    )
    print(table(results))
