"""Small all-reduces: commrt (``algorithm="auto"``) against mpi4py's ``Allreduce`` on a numpy
buffer, interleaved in one run (issue 25's small-message goals: at most 3x at 8 B on 2 ranks,
1.2x at 64 KiB on 2 ranks, 1.5x at 64 KiB on 4)::

    mpiexec -n 2 python bench/allreduce_small_vs_mpi.py              # one run, 8 B and 64 KiB
    mpiexec -n 4 python bench/allreduce_small_vs_mpi.py --sizes 64K  # one run, 4 ranks
    python bench/allreduce_small_vs_mpi.py --runs 5 --ranks 2,4      # 5 separate jobs each
    python bench/allreduce_small_vs_mpi.py --runs 5 --python NEW,OLD # before/after, alternating

One run: per size, ``--rounds`` rounds, each timing ``--calls`` calls of commrt's all-reduce
and then as many of ``MPI_Allreduce`` (a barrier before each); the ratio is the median
per-call time of commrt over MPI's. ``--runs N`` (without mpiexec) starts N separate
``mpiexec -n P`` jobs per rank count P, one after the other, and prints each (P, size)'s
ratio over the runs (min / median / max), with the load average, against the goal;
``--python A,B`` alternates the jobs between two interpreters (two installs of commrt).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: (ranks, bytes) -> the issue's goal for commrt's time over MPI_Allreduce's
GOALS = {(2, 8): 3.0, (2, 64 << 10): 1.2, (4, 64 << 10): 1.5}
TAG = "RESULT "


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``1M`` -> bytes (a multiple of 4: float32 elements)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20}.get(t[-1:], 1)
    n = int(t[:-1] if scale > 1 else t) * scale
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError(f"size {text!r}: a positive multiple of 4 bytes")
    return n


def label(nbytes: int) -> str:
    return f"{nbytes >> 10} KiB" if nbytes >= 1024 and nbytes % 1024 == 0 else f"{nbytes} B"


def measure(sizes: list[int], rounds: int, calls: int) -> list[dict]:
    """One run on this job's ranks (under mpiexec); every rank returns the rows."""
    import numpy as np
    import torch
    from mpi4py import MPI

    import commrt

    comm = commrt.init("mpi", timeout=60)
    world = MPI.COMM_WORLD
    rows = []
    for nbytes in sizes:
        # zeros: sums stay zero (no overflow to inf, no denormals) on both sides
        x, a = torch.zeros(nbytes // 4), np.zeros(nbytes // 4, dtype=np.float32)

        def ours(n, x=x):
            for _ in range(n):
                commrt.all_reduce(x, comm, algorithm="auto", op="sum")

        def native(n, a=a):
            for _ in range(n):
                world.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

        def per_call(loop, n):
            world.Barrier()
            t = time.perf_counter()
            loop(n)
            return (time.perf_counter() - t) / n

        per_call(ours, calls // 2), per_call(native, calls // 2)  # warm-up (auto probes here)
        mine, theirs = [], []
        for _ in range(rounds):
            mine.append(per_call(ours, calls))
            theirs.append(per_call(native, calls))
        c, m = statistics.median(mine), statistics.median(theirs)
        rows.append(
            dict(ranks=comm.world_size, nbytes=nbytes, commrt_s=c, mpi_s=m, ratio=c / m,
                 rounds=[p / q for p, q in zip(mine, theirs)])
        )  # fmt: skip
    comm.close()
    return rows


def one_run(args) -> None:
    rows = measure(args.sizes, args.rounds, args.calls)
    if int(os.environ.get("PMI_RANK", "0")) != 0:
        return
    if args.json:  # for --runs: one line per size
        for r in rows:
            print(TAG + json.dumps(r))
        return
    print(
        f"{'ranks':>5} {'size':>8} {'commrt us':>10} {'MPI us':>8} {'ratio':>6} {'goal':>5}  rounds"
    )
    for r in rows:
        goal = GOALS.get((r["ranks"], r["nbytes"]))
        spread = " ".join(f"{q:.1f}" for q in r["rounds"])
        print(
            f"{r['ranks']:>5} {label(r['nbytes']):>8} {r['commrt_s'] * 1e6:>10.2f} "
            f"{r['mpi_s'] * 1e6:>8.2f} {r['ratio']:>6.2f} {goal or '-':>5}  {spread}"[:80]
        )


def many_runs(args) -> int:
    """``--runs`` separate jobs per rank count (and per interpreter, alternating); returns 1
    if a goal was missed by the first interpreter (the one under test)."""
    ratios: dict[tuple[int, int, str], list[float]] = {}
    loads = []
    pythons = args.python or [sys.executable]
    for _ in range(args.runs):
        for ranks in args.ranks:
            for py in pythons:  # alternate: before and after share the same load
                loads.append(os.getloadavg()[0])
                for r in _job(args, ranks, py):
                    ratios.setdefault((r["ranks"], r["nbytes"], py), []).append(r["ratio"])
    print(f"{args.runs} runs each, load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    for i, py in enumerate(pythons):
        print(f"  {'abcdefgh'[i]}: {py}"[:80])
    print(
        f"{'ranks':>5} {'size':>7} {'py':>2} {'min':>5} {'median':>6} {'max':>5} {'goal':>4} "
        f"{'held':>4}  ratios"
    )
    missed = False
    for (ranks, nbytes, py), rs in sorted(ratios.items(), key=lambda kv: kv[0][:2]):
        goal = GOALS.get((ranks, nbytes))
        held = "-" if goal is None else f"{sum(r <= goal for r in rs)}/{len(rs)}"
        missed |= goal is not None and py == pythons[0] and max(rs) > goal
        print(
            f"{ranks:>5} {label(nbytes):>7} {'abcdefgh'[pythons.index(py)]:>2} {min(rs):>5.2f} "
            f"{statistics.median(rs):>6.2f} {max(rs):>5.2f} {goal or '-':>4} {held:>4}  "
            f"{' '.join(f'{r:.2f}' for r in rs)}"[:80]
        )
    return int(missed)


def _job(args, ranks: int, python: str) -> list[dict]:
    """One run as its own ``mpiexec`` job; its rows."""
    cmd = ["mpiexec", "-n", str(ranks), python, os.path.abspath(__file__), "--json"]
    cmd += ["--sizes", ",".join(map(str, args.sizes)), "--rounds", str(args.rounds)]
    cmd += ["--calls", str(args.calls)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
    lines = out.stdout.splitlines()
    return [json.loads(line[len(TAG) :]) for line in lines if line.startswith(TAG)]


def main() -> None:
    def sizes(text: str) -> list[int]:
        return [parse_size(s) for s in text.split(",")]

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=sizes, default=[8, 64 << 10], help="e.g. 8,64K")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=3000, help="calls per round and side")
    p.add_argument("--runs", type=int, default=0, help="separate mpiexec jobs per rank count")
    p.add_argument("--ranks", type=lambda s: [int(r) for r in s.split(",")], default=[2])
    p.add_argument(
        "--python",
        type=lambda s: s.split(","),
        help="with --runs: the ranks' interpreters, runs alternating between them (the first "
        "is under test; e.g. a second venv with the code before a change installed)",
    )
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.runs:
        sys.exit(many_runs(args))
    one_run(args)


if __name__ == "__main__":
    main()
