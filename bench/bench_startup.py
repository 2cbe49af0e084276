"""``commrt train``'s start-up, phase by phase: the medians of several whole runs.

    python bench/bench_startup.py                       # 5 runs, 2 ranks, shm
    python bench/bench_startup.py --runs 7 --backend gloo
    python bench/bench_startup.py --python A --python B # alternated, two installs

Each run is ``python -m commrt train --nproc N --epochs 1`` from a temporary folder, a
fresh process tree as a user starts it; the summary's start-up row (the launch to the
first step) and its phases (processes and imports, meeting the other ranks, data and
model, the first broadcast) are read back. With several ``--python`` the interpreters
take turns run by run (compare installs in one sitting: the machine's load moves). Prints
one table: median (min–max) seconds per row and interpreter.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile


def start_up_rows(out: str) -> dict[str, float]:
    """The summary's start-up row and the phase rows indented under it: label -> seconds."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("start-up"))
    rows = {"start-up": float(lines[at].split()[1])}
    for line in lines[at + 1 :]:
        if not line.startswith("  "):
            break
        label, value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        rows[f"  {label}"] = float(value.split()[0])
    return rows


def one_run(python: str, nproc: int, backend: str) -> dict[str, float]:
    """The start-up rows of one ``commrt train`` run, from a temporary folder."""
    cmd = [python, "-m", "commrt", "train", "--nproc", str(nproc), "--epochs", "1"]
    cmd += ["--backend", backend]
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return start_up_rows(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per interpreter (default 5)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--backend", default="shm", help="transport (default shm)")
    parser.add_argument(
        "--python", action="append", help="an interpreter with commrt installed (repeatable)"
    )
    args = parser.parse_args(argv)
    pythons = args.python or [sys.executable]
    seen: dict[str, dict[str, list[float]]] = {p: {} for p in pythons}
    for i in range(args.runs):
        for python in pythons:  # alternated: each run's neighbours share its load
            for label, seconds in one_run(python, args.nproc, args.backend).items():
                seen[python].setdefault(label, []).append(seconds)
            print(f"run {i + 1}/{args.runs} done ({python})", file=sys.stderr, flush=True)
    labels = list(dict.fromkeys(k for rows in seen.values() for k in rows))
    print(f"{'seconds, median (min-max)':32}" + "".join(f"{p[-28:]:>30}" for p in pythons))
    for label in labels:
        cells = []
        for python in pythons:
            xs = seen[python].get(label)
            cells.append(
                f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-"
            )
        print(f"{label:32}" + "".join(f"{c:>30}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
