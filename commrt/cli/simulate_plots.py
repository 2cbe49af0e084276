"""The figures of ``commrt simulate``, drawn from its report (no simulation here).

One function per figure; :func:`plot_all` writes them all into ``out_dir`` under
the names in :data:`FILES`.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from commrt.cli import plotting
from commrt.cli.units import fmt_bytes

FILES = {
    "p": "sim_time_vs_p.png",
    "size": "sim_time_vs_size.png",
    "stragglers": "sim_stragglers.png",
    "backup": "sim_backup.png",
    "gossip": "sim_gossip_vs_p.png",
}
STYLES = {
    "ring": "o-",
    "halving_doubling": "s-",
    "torus2d": "^-",
    "auto": "k--",
    "gossip (rotate)": "D-",
    "gossip (fixed cube)": "v--",
}


def plot_all(report: dict, names: Sequence[str], out_dir: str, describe: str) -> list[str]:
    """Every figure of ``report`` (of the sections it holds), written into ``out_dir``;
    returns their paths.

    ``describe`` names the network in the titles.
    """
    figures = (  # (FILES key, the report's section, what draws it)
        ("p", "vs_p", lambda path: plot_vs_p(report, names, describe, path)),
        ("size", "vs_size", lambda path: plot_vs_size(report["vs_size"], names, path)),
        ("stragglers", "stragglers", lambda path: plot_stragglers(report, path)),
        ("backup", "backup", lambda path: plot_backup(report, path)),
        ("gossip", "gossip", lambda path: plot_gossip(report, describe, path)),
    )
    return [
        draw(os.path.join(out_dir, FILES[key]))
        for key, section, draw in figures
        if section in report
    ]


def plot_vs_p(report: dict, names: Sequence[str], describe: str, path: str) -> str:
    ps = report["p"]
    sizes = list(report["vs_p"])
    fig, axes = plotting.figure(len(sizes), (6.2 * len(sizes), 4.6))
    for ax, nbytes in zip(axes, sizes):
        for n in names:
            ts = [t for t, _ in report["vs_p"][nbytes][n]]
            ax.plot(
                ps,
                np.array(ts) * 1e3,
                STYLES.get(n, ".-"),
                label=n,
                markersize=4,
                linewidth=1.2 if n == "auto" else 1.6,
            )
        plotting.style(
            ax,
            xlabel="ranks p",
            ylabel="time per all-reduce (ms)",
            logy=True,
            title=f"{fmt_bytes(nbytes)} all-reduce",
        )
    fig.suptitle(f"simulated all-reduce vs p · {describe}", fontsize=9)
    return plotting.save(fig, path)


def plot_vs_size(vs: dict, names: Sequence[str], path: str) -> str:
    fig, (ax,) = plotting.figure(1, (7.5, 4.8))
    for n in names:
        ax.plot(
            vs["sizes"], np.array(vs["times"][n]) * 1e3, STYLES.get(n, ".-"), label=n, markersize=4
        )
        c = vs["crossover"].get(n)
        if c and n != "auto":
            i = vs["sizes"].index(c)
            ax.plot([c], [vs["times"][n][i] * 1e3], "x", color="gray", markersize=9)
    plotting.style(
        ax,
        xlabel="message size (bytes)",
        ylabel="time per all-reduce (ms)",
        logy=True,
        title_size=9,
        title=f"p = {vs['p']}: latency-bound (flat) → bandwidth-bound (slope 1); "
        f"× = time 2× the smallest size's",
    )
    return plotting.save(fig, path)


def plot_stragglers(report: dict, path: str) -> str:
    ps, st = report["p"], report["stragglers"]
    fig, (ax,) = plotting.figure(1, (7.5, 4.8))
    for i, (d, v) in enumerate(st["delays"].items()):
        color = f"C{i}"
        ax.plot(ps, np.array(v["mean"]) * 1e3, "-", color=color, label=f"{d}: mean")
        ax.plot(ps, np.array(v["p99"]) * 1e3, ":", color=color, label="p99")
    plotting.style(
        ax,
        xlabel="ranks p",
        ylabel="synchronous step time (ms)",
        logy=True,
        title_size=9,
        title=f"{st['compute_s'] * 1e3:g} ms compute + per-rank delay + all-reduce; "
        "the slowest rank sets the pace",
    )
    ax.legend(fontsize=7, ncol=2)
    return plotting.save(fig, path)


def plot_backup(report: dict, path: str) -> str:
    ps, bk = report["p"], report["backup"]
    fig, axes = plotting.figure(len(bk["delays"]), (6.2 * len(bk["delays"]), 4.6))
    for ax, (d, rows) in zip(axes, bk["delays"].items()):
        for i, (k, v) in enumerate(rows.items()):
            pts = [(p, m, q) for p, m, q in zip(ps, v["mean"], v["p99"]) if m is not None]
            xs = [x for x, _, _ in pts]
            ax.plot(xs, [m * 1e3 for _, m, _ in pts], "-", color=f"C{i}", label=f"{k}: mean")
            ax.plot(xs, [q * 1e3 for _, _, q in pts], ":", color=f"C{i}", label="p99")
        plotting.style(
            ax,
            xlabel="ranks p = N + b",
            ylabel="step time (ms)",
            logy=True,
            title_size=9,
            title=f"backup workers, {d}",
        )
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(
        f"{bk['compute_s'] * 1e3:g} ms compute + per-rank delay; the step starts at "
        f"the N-th arrival",
        fontsize=9,
    )
    return plotting.save(fig, path)


def plot_gossip(report: dict, describe: str, path: str) -> str:
    ps = report["p"]
    sizes = list(report["gossip"])
    fig, axes = plotting.figure(len(sizes), (6.2 * len(sizes), 4.6))
    for ax, nbytes in zip(axes, sizes):
        for n, vals in report["gossip"][nbytes].items():
            ms = np.array([t for t, _ in vals]) * 1e3
            ax.plot(ps, ms, STYLES.get(n, ".-"), label=n, markersize=4)
        plotting.style(
            ax,
            xlabel="ranks p",
            ylabel="communication per training step (ms)",
            logy=True,
            title=f"{fmt_bytes(nbytes)} of gradients: one gossip step vs one all-reduce",
        )
    fig.suptitle(f"simulated gossip vs all-reduce · {describe}", fontsize=9)
    return plotting.save(fig, path)
