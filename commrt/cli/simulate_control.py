"""The control-plane section of ``commrt simulate``: backup workers' store cost per step.

Prices :func:`commrt.sim.control.control_cost` for p = 4 … ``--max-p`` with
the store costs ``bench/bench_control_plane.py`` measured (or
``--store-cost RTT_US,OP_US,KEY_US``), flat (the protocol as built) and
two-level (a leader per node, the simulator's proposal), and prints one
line per p at most 80 columns wide. Each step's cost is its arrival and
its commit (gloo's: :mod:`commrt.sync.backup.recovery`); a last line says
the commit's part of the store's work. ``commrt simulate --only control``
prints this section alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Sequence

from commrt.cli.simulate_sections import fit
from commrt.cli.units import named
from commrt.sim.control import HEARTBEAT_S, StoreCost, control_cost, first_saturated

#: backups of the priced jobs
BACKUPS = 1


@named("store cost")
def store_cost(text: str) -> StoreCost:
    """``--store-cost``'s type: ``RTT_US,OP_US,KEY_US``."""
    try:
        return StoreCost.parse(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store-cost",
        type=store_cost,
        default=None,
        metavar="RTT_US,OP_US,KEY_US",
        help="control store costs in microseconds: a round trip, the server's time per "
        "operation and per extra key (default: torch's TCPStore, measured over loopback)",
    )


def _ms(t: float) -> str:
    if math.isinf(t):
        return "saturated"
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def _pct(x: float) -> str:
    return f"{x * 100:.2g}%" if x < 1 else f"{x * 100:,.0f}%"


def _finite(row: dict) -> dict:
    """The row for JSON: a saturated (infinite) wait becomes null."""
    return {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in row.items()}


def control_line(c) -> str:
    return (
        f"{c.p:>5}{_ms(c.flat_s):>11}{_pct(c.flat_busy):>9}"
        f"{_ms(c.two_level_s):>12}{_pct(c.two_level_busy):>9}"
        f"{_pct(c.heartbeat_share):>9}{_pct(c.two_level_heartbeat_share):>9}"
        f"{_pct(c.heartbeat_share_before):>10}"
    )


def commit_share(c, cost: StoreCost, step_s: float, form: str = "flat") -> float:
    """The commit's share of the store's work per step at ``c`` (``form``: flat, two-level)."""
    if form == "flat":
        ops, busy, hb = c.flat_commit_ops, c.flat_busy, c.heartbeat_share
    else:
        ops, busy, hb = c.two_level_commit_ops, c.two_level_busy, c.two_level_heartbeat_share
    return ops * cost.op_s / step_s / (busy - hb)


def commit_line(costs: Sequence, cost: StoreCost, step_s: float) -> str:
    """The commit's share of the store's work at the smallest and largest p."""
    lo, hi = costs[0], costs[-1]

    def shares(form: str) -> str:
        a, b = (commit_share(c, cost, step_s, form) for c in (lo, hi))
        return f"{_pct(a)} at p = {lo.p}, {_pct(b)} at {hi.p}"

    flat, two = shares("flat"), shares("two-level")
    return f"# the commit's share of the store's work: flat {flat}; 2-level {two}"


def control_section(
    ps: Sequence[int], cost: StoreCost | None, ranks_per_node: int, step_s: float, out
) -> dict:
    """Print the table; return every number (for ``--json``)."""
    cost = cost or StoreCost.measured()
    ps = [p for p in ps if p >= 4]
    costs = [
        control_cost(p, BACKUPS, cost, ranks_per_node=ranks_per_node, step_s=step_s) for p in ps
    ]
    for h in (
        f"\n## backup workers' control plane · one TCPStore: {cost.describe()}",
        f"# per global step, b = {BACKUPS}, a step every {step_s * 1e3:g} ms, heartbeat "
        f"{HEARTBEAT_S:g} s; 2-level: a leader per {ranks_per_node} ranks",
        "# wait: a rank's time in the store per step, arrival (who takes part) and",
        "# commit (gloo: every rank reads the outcome); busy: the store's share of time",
        "# (100%: saturated); hb: the heartbeats' share (flat, 2-level, and before:",
        "# every rank reading all p counters)",
        f"{'p':>5}{'flat wait':>11}{'busy':>9}{'2-lvl wait':>12}{'busy':>9}"
        f"{'hb':>9}{'hb 2-lvl':>9}{'hb before':>10}",
    ):
        out(fit(h).rstrip())
    for c in costs:
        out(control_line(c))
    flat, two = first_saturated(costs, "flat"), first_saturated(costs, "two-level")
    if costs:
        out(fit(commit_line(costs, cost, step_s)))
    out(
        fit(
            f"# one store saturates at p = {flat or '—'} flat, {two or '—'} two-level "
            f"(source: {cost.source})"
        )
    )
    return {
        "store": dataclasses.asdict(cost),
        "backups": BACKUPS,
        "step_s": step_s,
        "ranks_per_node": ranks_per_node,
        "rows": [_finite(dataclasses.asdict(c)) for c in costs],
        "saturated_at": {"flat": flat, "two-level": two},
    }
