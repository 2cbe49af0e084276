"""How good could the α-β model be on a run of bench/auto_vs_candidates.py? The best α
in hindsight.

For each run's JSON (``--json`` of auto_vs_candidates.py, or the files
``bench/auto_goal.py --keep DIR`` leaves) and each size, this replays every
candidate's schedule on the run's probed network with one α for every link
(β and γ as probed) and scans α for the value that makes the worst
candidate's error smallest. If even that α leaves a candidate more than 20%
off, no probe of α could have met the issue's 20%: the model's structure
(one α a message, messages of a step overlapping) is what misses, not the
measurement. No processes, no network: it reads the files::

    python bench/model_hindsight.py out/goal/*.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from commrt import sim
from commrt.algorithms.auto import candidates, label
from commrt.sim import Network

#: the α scanned, seconds: 0.1 to 12 ms
ALPHAS = np.linspace(1e-4, 12e-3, 120)


def best_alpha(probe: dict, row: dict) -> tuple[float, float, dict]:
    """(α, worst |error|, errors by candidate) at the α whose worst |error| is least."""
    p, nbytes = probe["world_size"], row["nbytes"]
    measured = {k: v for k, v in row["measured"].items() if k != "auto"}
    algs = [a for a in candidates(p) if label(a) in measured]
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
        errs = {
            label(a): sim.simulate(a, p, nbytes, net).time_s / measured[label(a)] - 1 for a in algs
        }
        worst = max(abs(e) for e in errs.values())
        if best is None or worst < best[1]:
            best = (float(alpha), worst, errs)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="JSON files of auto_vs_candidates.py --json")
    args = ap.parse_args(argv)
    print(f"{'run':<14} {'size':>8} {'best α':>8} {'worst':>6}  the most off at that α")
    for path in args.runs:
        try:
            with open(path) as f:
                run = json.load(f)
            probe, rows = run["probe"], run["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"{path} is not a JSON that auto_vs_candidates.py --json wrote ({e!r})")
        layout = f"{probe['world_size'] // probe.get('ranks_per_node', 1)}x"
        layout += f"{probe.get('ranks_per_node', 1)}"
        for row in rows:
            alpha, worst, errs = best_alpha(probe, row)
            off = max(errs, key=lambda k: abs(errs[k]))
            name = f"{layout} {path.rsplit('/', 1)[-1][:8]}"
            print(
                f"{name:<14} {row['nbytes'] >> 10:>7}K {alpha * 1e3:6.2f}ms {worst * 100:5.0f}%  "
                f"{off} {errs[off] * 100:+.0f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
