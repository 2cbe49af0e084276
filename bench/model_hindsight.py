"""How good could the model be on a run of bench/auto_vs_candidates.py? The best α, or
the best per-step overheads, in hindsight.

For each run's JSON (``--json`` of auto_vs_candidates.py, or the files
``bench/auto_goal.py --keep DIR`` leaves) and each size, this replays every
candidate's schedule on the run's probed network with one α for every link
(β and γ as probed) and scans α for the value that makes the worst
candidate's error smallest. If even that α leaves a candidate more than 20%
off, no probe of α could have met the issue's 20%: the model's structure
(one α a message, messages of a step overlapping) is what misses, not the
measurement.

With ``--overheads`` it does the same for the per-step overheads
(:class:`commrt.sim.Overhead`) of runs whose probe measured them: per size,
a coordinate search from the probed values for the shift, exchange and
several-message costs that make the worst candidate's error smallest (β, γ
and tiers as probed). What that leaves over 20% the probe's calibration could
not have fixed; what it brings under, a better calibration could.

No processes, no network: it reads the files::

    python bench/model_hindsight.py out/goal/*.json
    python bench/model_hindsight.py --overheads out/goal/*.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np

from commrt import sim
from commrt.algorithms.auto import candidates, label
from commrt.sim import Network, Overhead

#: the α scanned, seconds: 0.1 to 12 ms
ALPHAS = np.linspace(1e-4, 12e-3, 120)


def errors_on(probe: dict, row: dict):
    """A function of a :class:`Network`: each measured candidate's error on it, as a dict."""
    p, nbytes = probe["world_size"], row["nbytes"]
    measured = {k: v for k, v in row["measured"].items() if k != "auto"}
    algs = [a for a in candidates(p) if label(a) in measured]
    return lambda net: {
        label(a): sim.simulate(a, p, nbytes, net).time_s / measured[label(a)] - 1 for a in algs
    }


def best_alpha(probe: dict, row: dict) -> tuple[float, float, dict]:
    """(α, worst |error|, errors by candidate) at the α whose worst |error| is least."""
    errors = errors_on(probe, row)
    best = None
    for alpha in ALPHAS:
        net = Network.from_probe(
            alpha,
            probe["beta_s_per_byte"],
            inter=(alpha, probe["inter_beta_s_per_byte"]) if probe.get("inter_alpha_s") else None,
            ranks_per_node=probe.get("ranks_per_node", 1),
            nics_per_node=probe.get("nics_per_node", 1),
            gamma_s_per_byte=probe.get("gamma_s_per_byte", 0.0),
        )
        errs = errors(net)
        worst = max(abs(e) for e in errs.values())
        if best is None or worst < best[1]:
            best = (float(alpha), worst, errs)
    return best


#: the factors each overhead is scaled by per pass, widest first
_SEARCH = [np.geomspace(1 / w, w, 17) for w in (4.0, 1.5, 1.1, 1.02)]


def best_overheads(probe: dict, row: dict) -> tuple[Overhead, float, dict]:
    """(overheads, worst |error|, errors by candidate) at the overheads whose worst |error|
    the search made least; ``ValueError`` for a run whose probe measured none."""
    net = Network.from_dict(probe)
    if net.overhead is None:
        raise ValueError("its probe measured no per-step overheads")
    on_net = errors_on(probe, row)

    def errors(x) -> dict:
        return on_net(dataclasses.replace(net, overhead=Overhead(*x)))

    def worst(x) -> float:
        return max(abs(e) for e in errors(x).values())

    x = list(dataclasses.astuple(net.overhead))
    best = worst(x)
    for factors in _SEARCH:
        for _ in range(3):  # passes over the three until none moves
            x, better = _search_pass(worst, x, best, factors)
            if better == best:
                break
            best = better
    return Overhead(*x), best, errors(x)


def _search_pass(worst, x: list, best: float, factors) -> tuple[list, float]:
    """One pass over each coordinate of ``x``: the point and its ``worst`` after moving each
    to its best multiple in ``factors`` (kept where none beats ``best``)."""
    for i in range(len(x)):
        for f in factors:
            y = x[:i] + [x[i] * f] + x[i + 1 :]
            w = worst(y)
            if w < best - 1e-12:
                x, best = y, w
    return x, best


def _report(probe: dict, row: dict, overheads: bool) -> str:
    """One line: the size, the best α or overheads, the worst error and the most off."""
    if overheads:
        over, worst, errs = best_overheads(probe, row)
        fit = "/".join(f"{v * 1e3:.2f}" for v in dataclasses.astuple(over))
    else:
        alpha, worst, errs = best_alpha(probe, row)
        fit = f"{alpha * 1e3:6.2f}ms"
    off = max(errs, key=lambda k: abs(errs[k]))
    short = off.replace("torus2d_pipelined", "tp").replace("_doubling", "_dbl")
    return (
        f"{row['nbytes'] >> 10:>7}K {fit:>14} {worst * 100:5.0f}%  {short} {errs[off] * 100:+.0f}%"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="JSON files of auto_vs_candidates.py --json")
    ap.add_argument(
        "--overheads",
        action="store_true",
        help="fit the per-step overheads (shift/exchange/several, ms) instead of α",
    )
    args = ap.parse_args(argv)
    fit = "shift/exch/multi" if args.overheads else "best α"
    print(f"{'run':<14} {'size':>8} {fit:>14} {'worst':>6}  the most off there")
    for path in args.runs:
        try:
            with open(path) as f:
                run = json.load(f)
            probe, rows = run["probe"], run["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"{path} is not a JSON that auto_vs_candidates.py --json wrote ({e!r})")
        layout = f"{probe['world_size'] // probe.get('ranks_per_node', 1)}x"
        layout += f"{probe.get('ranks_per_node', 1)}"
        name = f"{layout} {path.rsplit('/', 1)[-1][:8]}"
        for row in rows:
            try:
                print(f"{name:<14} {_report(probe, row, args.overheads)}")
            except ValueError as e:
                ap.error(f"{path}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
