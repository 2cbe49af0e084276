"""The noise floor of the model-error table: every candidate timed twice, side by side.

Every candidate of ``auto`` is timed twice per round, under two names, the way
``bench/auto_vs_candidates.py`` times it: the same calls per run (``calls_for``),
the same rounds (11 below 4 MiB, 5 from there), the order rotated each round, a
call's time the slowest rank's, each figure the median over rounds. The two medians
of one schedule differ by what that measurement cannot tell apart, so an error bound
tighter than their gap cannot be checked with it. On the namespace hosts here (4-8
ranks on 2 cores) the gap reached 1.21x at 64 KiB and 3% at 1 MiB (README, "Why
64 KiB stays out of reach on this machine").

Run on namespace hosts (root)::

    python tests/netns.py --hosts 4 --ranks-per-host 2 --rate 1gbit -- \\
        python bench/noise_floor.py --size 64K

Rank 0 prints the table (within 80 columns); ``--json PATH`` keeps the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

# run as a script, this folder is on sys.path: time exactly as the table's benchmark does
from auto_vs_candidates import calls_for, timed

import commrt
from commrt.algorithms.auto import candidates, label
from commrt.cli.bench import timing_buffer
from commrt.cli.units import output_file, parse_size


def twice(comm, runs: dict, rounds: int, calls: int) -> dict[str, tuple[float, float]]:
    """``{name: (median as A, median as B)}``: each schedule timed twice per round."""
    names = [(n, k) for k in "AB" for n in runs]
    times = {nk: [] for nk in names}
    for r in range(rounds):
        for nk in names[r % len(names) :] + names[: r % len(names)]:
            times[nk].append(timed(comm, runs[nk[0]], calls))
    return {n: (statistics.median(times[n, "A"]), statistics.median(times[n, "B"])) for n in runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=64 << 10, help="bytes (64K)")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--json", type=output_file, default=None, help="keep the medians (rank 0)")
    args = ap.parse_args(argv)
    comm = commrt.init(args.backend, timeout=600)
    x = timing_buffer(max(1, args.size // 4))
    runs = {
        label(a): (lambda a=a: commrt.all_reduce(x, comm, algorithm=a, op="sum"))
        for a in candidates(comm.world_size)
    }
    for fn in runs.values():
        fn()  # plans, scratch, connections
    rounds = 5 if args.size >= 4 << 20 else 11  # auto_vs_candidates' rounds at --rounds 5
    same = twice(comm, runs, rounds, calls_for(args.size))
    if comm.rank == 0:
        w = max(map(len, runs))
        print(f"# {comm.world_size} ranks, {args.size} B: each candidate twice, ms (median)")
        print(f"{'candidate':<{w}} {'as A':>8} {'as B':>8} {'B/A':>6}")
        for n, (a, b) in same.items():
            print(f"{n:<{w}} {a * 1e3:8.2f} {b * 1e3:8.2f} {b / a:6.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(size=args.size, world_size=comm.world_size, twice=same), f)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
