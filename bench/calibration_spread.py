"""How repeatable is the probe's step-overhead calibration here? The same calibration,
several times back to back.

The probe fits the per-step overheads (:class:`commrt.sim.Overhead`) to one
timing of small all-reduces (``commrt.probe_steps.calibration_times``). If
two such timings a second apart differ by more than the model's error
budget, no fit can stay within it at the sizes those overheads price: that
is the machine's noise, not the model's. This runs that very timing
``--times`` times in a row and prints each (milliseconds per call, agreed on
every rank as the probe agrees them), then per kind the spread::

    python tests/netns.py --hosts 4 --ranks-per-host 2 --rate 1gbit -- \\
        python bench/calibration_spread.py
    mpiexec -n 4 python bench/calibration_spread.py --backend mpi

On the namespace hosts here (2 cores), six timings in a row: at 4 × 2 the
ring's call took 21.5 to 35.8 ms (1.67×), at 2 × 2 recursive doubling's
1.25 to 2.27 ms (1.81×). That is why the README's 64 KiB model error misses
20% with the probe's overheads and meets it with overheads fitted in
hindsight to the same run (bench/model_hindsight.py --overheads).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import commrt
from commrt.probe_steps import calibration_times


def spread(comm, times: int, repeats: int, say=print) -> dict[str, list[float]]:
    """``{kind: [seconds per call, one per timing]}``, printing a line per timing."""
    out: dict[str, list[float]] = {}
    for i in range(times):
        _, t = calibration_times(comm, repeats)
        for kind, s in t.items():
            out.setdefault(kind, []).append(s)
        say(f"{i + 1:>6} " + "".join(f"{kind:>9} {s * 1e3:8.2f}" for kind, s in t.items()))
    return out


def summary(runs: dict[str, list[float]]) -> list[str]:
    """Per kind: min, median and max ms per call, and max over min."""
    lines = [f"{'kind':<9} {'min':>8} {'median':>8} {'max':>8} {'max/min':>8}"]
    for kind, ts in runs.items():
        lo, mid, hi = min(ts), statistics.median(ts), max(ts)
        lines.append(f"{kind:<9} {lo * 1e3:8.2f} {mid * 1e3:8.2f} {hi * 1e3:8.2f} {hi / lo:8.2f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--times", type=int, default=6, help="calibrations in a row (6)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per calibration (5)")
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args(argv)
    if args.times < 2 or args.repeats < 1:
        ap.error("--times must be at least 2 and --repeats at least 1")
    comm = commrt.init(args.backend, timeout=120)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# {comm.world_size} ranks, {comm.backend.value}: ms per call of each calibration")
    runs = spread(comm, args.times, args.repeats, say)
    for line in summary(runs):
        say(line)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
