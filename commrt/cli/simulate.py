"""``commrt simulate``: all-reduce at scale, on paper.

Sweeps world size p (2 … ``--max-p``, powers of two) and message size
through :func:`commrt.sim.simulate` (the real schedules of ring,
halving-doubling, 2D torus and ``auto``), prints tables and writes three
PNGs to ``--out-dir``:

* ``sim_time_vs_p.png``: time per all-reduce vs p, one line per algorithm,
  one panel per message size (``--sizes``, default 64K and 256M);
* ``sim_time_vs_size.png``: time vs message size at ``--at-p``, showing
  where each algorithm turns from latency-bound to bandwidth-bound and
  which is fastest where;
* ``sim_stragglers.png``: mean and p99 time of a synchronous training step
  (``--compute-ms`` of compute, then the fastest algorithm's all-reduce of
  the largest size) vs p, with per-rank delays of equal mean and
  different tails;
* ``sim_backup.png``: the same step with backup workers (Chen et al.): it
  starts once the first N of the p = N + b ranks arrived, for b = 0, 1, 2
  and about 2% of p, under exponential and Pareto delays.
* ``sim_gossip_vs_p.png``: one gossip step (GossipGraD's one-peer exchange,
  hypercube with and without rotation, mean over two periods) vs one ring
  and one torus all-reduce of the same buffer, per size, vs p.

It runs in one process (never relaunched as ranks). Usable on its own as
``python -m commrt.cli.simulate``; ``commrt.cli.commands`` adds it with :func:`register`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import numpy as np

from commrt import sim
from commrt.cli import plotting
from commrt.cli.units import fmt_bytes, positive_int, size_list

DEFAULT_ALGORITHMS = "ring,halving_doubling,torus2d,auto"


def size_sweep(p: int, itemsize: int = 4) -> tuple[int, ...]:
    """Message sizes ×4 from the first power of two ≥ one element per chunk (p·itemsize) to 1 GiB.

    Smaller buffers leave chunks empty, and empty chunks send nothing.
    """
    k = max(3, (p * itemsize - 1).bit_length())
    return tuple(1 << j for j in range(k, 31, 2))
FILES = {"p": "sim_time_vs_p.png", "size": "sim_time_vs_size.png",
         "stragglers": "sim_stragglers.png", "backup": "sim_backup.png",
         "gossip": "sim_gossip_vs_p.png"}


# ------------------------------------------------------------------ parsing
def _pow2(text: str) -> int:
    v = int(text)
    if v < 2 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two >= 2, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-p", type=_pow2, default=4096, help="largest world size (power of two, default 4096)")
    p.add_argument("--sizes", type=size_list, default=[64 << 10, 256 << 20],
                   help="message sizes for the time-vs-p sweep (default 64K,256M)")
    p.add_argument("--at-p", type=_pow2, default=1024, help="world size of the time-vs-size sweep (default 1024)")
    p.add_argument("--network", default="h100",
                   help="'h100' (NVLink4 + NDR IB preset, sources in commrt.sim), 'flat:ALPHA_US,GBPS', or a "
                        "JSON file (a commrt.probe result or Network.to_dict())")
    p.add_argument("--ranks-per-node", type=positive_int, default=None, help="override the network's ranks per node")
    p.add_argument("--nics-per-node", type=positive_int, default=None, help="override the network's NICs per node")
    p.add_argument("--algorithms", default=DEFAULT_ALGORITHMS,
                   help=f"comma-separated (default {DEFAULT_ALGORITHMS}); torus2d takes one row per node")
    p.add_argument("--compute-ms", type=float, default=100.0, help="compute per training step (default 100 ms)")
    p.add_argument("--delay-ms", type=float, default=5.0, help="mean per-rank delay (default 5 ms)")
    p.add_argument("--samples", type=positive_int, default=400, help="sampled steps per point (default 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="sim_out", help="where the PNGs go (default ./sim_out)")
    p.add_argument("--no-plots", action="store_true", help="tables only")


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``simulate`` to a ``commrt`` sub-command parser (single-process: no relaunch)."""
    p = subparsers.add_parser("simulate", help="all-reduce at scale under an α-β network model (plots)",
                              description=__doc__.split("\n\n")[0].replace("``", ""))
    add_arguments(p)
    p.set_defaults(run=cmd_simulate, single_process=True, parser=p)
    return p


def network_from_args(args) -> sim.Network:
    spec = args.network
    if spec == "h100":
        net = sim.Network.h100_nvlink_ib()
    elif spec.startswith("flat:"):
        try:
            a, bw = (float(x) for x in spec[5:].split(","))
        except ValueError:
            raise SystemExit(f"commrt simulate: --network flat:ALPHA_US,GBPS, got {spec!r}") from None
        net = sim.Network(sim.Link.from_bandwidth(a, bw), sim.Link.from_bandwidth(a, bw), 1, 1, spec)
    elif os.path.exists(spec):
        net = sim.Network.load(spec)
    else:
        raise SystemExit(f"commrt simulate: --network must be h100, flat:ALPHA_US,GBPS or a JSON file; "
                         f"{spec!r} is none of them")
    import dataclasses
    if args.ranks_per_node is not None:
        net = dataclasses.replace(net, ranks_per_node=args.ranks_per_node)
    if args.nics_per_node is not None:
        net = dataclasses.replace(net, nics_per_node=args.nics_per_node)
    return net


# ------------------------------------------------------------------- sweeps
class Sweeper:
    """Simulates (algorithm, p, nbytes) once; ``auto`` reuses the candidates' results."""

    def __init__(self, network: sim.Network, progress=None):
        self.net = network
        self.memo: dict = {}
        self.progress = progress or (lambda msg: None)

    def _alg(self, name: str, p: int):
        from commrt.algorithms import Torus2D, resolve
        if name == "torus2d":
            return Torus2D(*Torus2D().shape(p, local_size=self.net.ranks_per_node))
        return resolve(name)

    def time(self, name: str, p: int, nbytes: int) -> tuple[float, str]:
        """(seconds, label) of one all-reduce; ``auto`` gives its choice's label."""
        if name == "auto":
            return self._auto(p, nbytes)
        from commrt.algorithms.auto import label
        alg = self._alg(name, p)
        return self._price(alg, label(alg), p, nbytes), label(alg)

    def _price(self, alg, lab: str, p: int, nbytes: int) -> float:
        key = (lab, p, nbytes)
        if key not in self.memo:
            t0 = time.perf_counter()
            self.memo[key] = sim.estimate(alg, p, nbytes, self.net)
            if time.perf_counter() - t0 > 1.0:
                self.progress(f"  (simulated {lab} at p={p}, {fmt_bytes(nbytes)}: "
                              f"{time.perf_counter() - t0:.1f} s)")
        return self.memo[key]

    def _auto(self, p: int, nbytes: int) -> tuple[float, str]:
        # Auto.choose's ranking (sim.price_all over its candidates, ties to the earlier one),
        # sharing this sweep's memo so no schedule is simulated twice.
        from commrt.algorithms.auto import candidates, label
        algs = candidates(p)
        times = sim.price_all(algs, p, nbytes, self.net, price=lambda a: self._price(a, label(a), p, nbytes))
        t, _, alg = min((t, i, a) for i, (t, a) in enumerate(zip(times, algs)) if t is not None)
        return t, label(alg)


def _fmt_time(t: float) -> str:
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def crossover(sizes: Sequence[int], times: Sequence[float]) -> int | None:
    """First size whose time is at least twice the smallest size's: where β starts to dominate α."""
    t0 = times[0]
    for n, t in zip(sizes, times):
        if t >= 2 * t0:
            return n
    return None


def run(args, out=print) -> dict:
    net = network_from_args(args)
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    from commrt.algorithms import resolve
    from commrt.schedule import Collective
    for n in names:
        if not resolve(n).supports(Collective.ALL_REDUCE):
            raise SystemExit(f"commrt simulate: {n} is not an all-reduce; gossip has a section "
                             f"of its own")
    ps = [1 << k for k in range(1, args.max_p.bit_length())]
    sw = Sweeper(net, progress=out)
    t_start = time.perf_counter()
    out(f"# commrt simulate · network {net.describe()}")
    out("# model: α-β per link class, NICs shared per node, per-rank clocks (commrt/sim.py docstring)")
    report: dict = {"network": net.to_dict(), "p": ps, "vs_p": {}, "vs_size": {}, "stragglers": {}}

    # 1. time vs p ------------------------------------------------------------
    for nbytes in args.sizes:
        out(f"\n## time per all-reduce vs p · {fmt_bytes(nbytes)}")
        out(f"{'p':>6} " + "".join(f"{n:>{30 if n == 'auto' else 22}}" for n in names))
        rows = {n: [] for n in names}
        for p in ps:
            cells = []
            for n in names:
                t, lab = sw.time(n, p, nbytes)
                rows[n].append((t, lab))
                cells.append(f"{_fmt_time(t):>11} {lab:>18}" if n == "auto" else f"{_fmt_time(t):>22}")
            out(f"{p:>6} " + "".join(cells), )
        report["vs_p"][nbytes] = rows

    # 2. time vs size at fixed p ------------------------------------------------
    p = args.at_p
    sweep = size_sweep(p)
    out(f"\n## time vs message size at p={p}")
    out(f"{'size':>10} " + "".join(f"{n:>20}" for n in names) + "   fastest")
    series = {n: [] for n in names}
    for nbytes in sweep:
        cells, best = [], None
        for n in names:
            t, lab = sw.time(n, p, nbytes)
            series[n].append(t)
            cells.append(f"{_fmt_time(t):>20}")
            if n != "auto" and (best is None or t < best[0]):
                best = (t, lab)
        auto_lab = sw.time("auto", p, nbytes)[1] if "auto" in names else (best[1] if best else "")
        out(f"{fmt_bytes(nbytes):>10} " + "".join(cells) + f"   {auto_lab}")
    out(f"latency-bound below, bandwidth-bound above (time = 2× the {fmt_bytes(sweep[0])} time):")
    cross = {}
    for n in names:
        c = crossover(sweep, series[n])
        cross[n] = c
        out(f"  {n:<18} {fmt_bytes(c) if c else '> ' + fmt_bytes(sweep[-1])}")
    report["vs_size"] = {"p": p, "sizes": list(sweep), "times": series, "crossover": cross}

    # 3. stragglers ---------------------------------------------------------------
    big = max(args.sizes)
    mean = args.delay_ms * 1e-3
    delays = [sim.NoDelay(), sim.Exponential(mean), sim.LogNormal(mean / np.exp(0.5), 1.0),
              sim.Pareto(mean, 2.0)]
    out(f"\n## synchronous step: {args.compute_ms:g} ms compute + per-rank delay (mean {args.delay_ms:g} ms) "
        f"+ all-reduce of {fmt_bytes(big)} (fastest algorithm), {args.samples} samples")
    out(f"{'p':>6} " + "".join(f"{str(d)[:34]:>36}" for d in delays))
    strag = {str(d): {"mean": [], "p99": []} for d in delays}
    algs = [n for n in names if n != "auto"] or ["ring"]
    for p in ps:
        t_coll, lab = min(sw.time(n, p, big) for n in algs)
        cells = []
        for d in delays:
            arr = sim.arrivals(p, args.compute_ms * 1e-3, d, args.samples, args.seed)
            step = sim.synchronous_start(arr) + t_coll
            m, q = float(step.mean()), float(np.percentile(step, 99))
            strag[str(d)]["mean"].append(m)
            strag[str(d)]["p99"].append(q)
            cells.append(f"{'mean ' + _fmt_time(m) + ' p99 ' + _fmt_time(q):>36}")
        out(f"{p:>6} " + "".join(cells))
    report["stragglers"] = {"delays": strag, "compute_s": args.compute_ms * 1e-3}
    report["backup"] = backup_sweep(args, ps, sw, algs, big, mean, out)
    report["gossip"] = gossip_sweep(ps, args.sizes, sw, out)
    out(f"\n# swept in {time.perf_counter() - t_start:.1f} s")

    if not args.no_plots:
        os.makedirs(args.out_dir, exist_ok=True)
        paths = plot_all(report, names, args, net)
        for path in paths:
            out(f"# wrote {os.path.abspath(path)}")
        report["files"] = paths
    return report


def backup_counts(p: int) -> dict[str, int]:
    """The b values compared at ``p`` ranks: 0, 1, 2 and about 2% of p (at least 1), all < p."""
    bs = {"b=0": 0, "b=1": 1, "b=2": 2, "b≈2%": max(1, round(0.02 * p))}
    return {k: b for k, b in bs.items() if b < p}


def backup_sweep(args, ps, sw, algs, nbytes: int, mean: float, out) -> dict:
    """Mean and p99 step time with backup workers: the step starts at the N-th of p = N + b
    arrivals (:func:`commrt.sim.first_n_start`), then the all-reduce among the N runs, priced
    as the p-rank one (b ≤ 2% of p changes it by little and equally for every b compared)."""
    delays = [sim.Exponential(mean), sim.Pareto(mean, 2.0)]
    res: dict = {}
    for d in delays:
        out(f"\n## backup workers · {args.compute_ms:g} ms compute + {d} per rank, "
            f"first N of p = N + b (mean / p99)")
        out(f"{'p':>6} " + "".join(f"{k:>24}" for k in backup_counts(4096)) + f"{'2% → b':>8}")
        rows = {k: {"mean": [], "p99": [], "b": []} for k in backup_counts(4096)}
        for p in ps:
            arr = sim.arrivals(p, args.compute_ms * 1e-3, d, args.samples, args.seed)
            t_coll = min(sw.time(n, p, nbytes)[0] for n in algs)
            cells = []
            for k in rows:
                b = backup_counts(p).get(k)
                if b is None:
                    for v in ("mean", "p99", "b"):
                        rows[k][v].append(None)
                    cells.append(f"{'—':>24}")
                    continue
                step = sim.first_n_start(arr, p - b) + t_coll
                m, q = float(step.mean()), float(np.percentile(step, 99))
                rows[k]["mean"].append(m)
                rows[k]["p99"].append(q)
                rows[k]["b"].append(b)
                cells.append(f"{_fmt_time(m) + ' / ' + _fmt_time(q):>24}")
            out(f"{p:>6} " + "".join(cells) + f"{backup_counts(p).get('b≈2%', 0):>8}")
        res[str(d)] = rows
    return {"delays": res, "compute_s": args.compute_ms * 1e-3}


# -------------------------------------------------------------------- plots
def plot_all(report: dict, names: Sequence[str], args, net: sim.Network) -> list[str]:
    ps = report["p"]
    paths = []
    styles = {"ring": "o-", "halving_doubling": "s-", "torus2d": "^-", "auto": "k--"}

    # time vs p
    sizes = list(report["vs_p"])
    fig, axes = plotting.figure(len(sizes), (6.2 * len(sizes), 4.6))
    for ax, nbytes in zip(axes, sizes):
        for n in names:
            ts = [t for t, _ in report["vs_p"][nbytes][n]]
            ax.plot(ps, np.array(ts) * 1e3, styles.get(n, ".-"), label=n, markersize=4,
                    linewidth=1.2 if n == "auto" else 1.6)
        plotting.style(ax, xlabel="ranks p", ylabel="time per all-reduce (ms)", logy=True,
                       title=f"{fmt_bytes(nbytes)} all-reduce")
    fig.suptitle(f"simulated all-reduce vs p · {net.describe()}", fontsize=9)
    paths.append(plotting.save(fig, os.path.join(args.out_dir, FILES["p"])))

    # time vs size
    vs = report["vs_size"]
    fig, (ax,) = plotting.figure(1, (7.5, 4.8))
    for n in names:
        ax.plot(vs["sizes"], np.array(vs["times"][n]) * 1e3, styles.get(n, ".-"), label=n, markersize=4)
        c = vs["crossover"].get(n)
        if c and n != "auto":
            i = vs["sizes"].index(c)
            ax.plot([c], [vs["times"][n][i] * 1e3], "x", color="gray", markersize=9)
    plotting.style(ax, xlabel="message size (bytes)", ylabel="time per all-reduce (ms)", logy=True, title_size=9,
                   title=f"p = {vs['p']}: latency-bound (flat) → bandwidth-bound (slope 1); "
                         f"× = time 2× the smallest size's")
    paths.append(plotting.save(fig, os.path.join(args.out_dir, FILES["size"])))

    # stragglers
    st = report["stragglers"]
    fig, (ax,) = plotting.figure(1, (7.5, 4.8))
    for i, (d, v) in enumerate(st["delays"].items()):
        color = f"C{i}"
        ax.plot(ps, np.array(v["mean"]) * 1e3, "-", color=color, label=f"{d}: mean")
        ax.plot(ps, np.array(v["p99"]) * 1e3, ":", color=color, label="p99")
    plotting.style(ax, xlabel="ranks p", ylabel="synchronous step time (ms)", logy=True, title_size=9,
                   title=f"{st['compute_s'] * 1e3:g} ms compute + per-rank delay + all-reduce; the slowest "
                         "rank sets the pace")
    ax.legend(fontsize=7, ncol=2)
    paths.append(plotting.save(fig, os.path.join(args.out_dir, FILES["stragglers"])))

    # backup workers
    bk = report["backup"]
    fig, axes = plotting.figure(len(bk["delays"]), (6.2 * len(bk["delays"]), 4.6))
    for ax, (d, rows) in zip(axes, bk["delays"].items()):
        for i, (k, v) in enumerate(rows.items()):
            pts = [(p, m, q) for p, m, q in zip(ps, v["mean"], v["p99"]) if m is not None]
            xs = [x for x, _, _ in pts]
            ax.plot(xs, [m * 1e3 for _, m, _ in pts], "-", color=f"C{i}", label=f"{k}: mean")
            ax.plot(xs, [q * 1e3 for _, _, q in pts], ":", color=f"C{i}", label="p99")
        plotting.style(ax, xlabel="ranks p = N + b", ylabel="step time (ms)", logy=True,
                       title_size=9, title=f"backup workers, {d}")
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{bk['compute_s'] * 1e3:g} ms compute + per-rank delay; the step starts at "
                 f"the N-th arrival", fontsize=9)
    paths.append(plotting.save(fig, os.path.join(args.out_dir, FILES["backup"])))
    paths.append(plot_gossip(report, args, net))
    return paths


GOSSIP_COMPARE = ("ring", "torus2d")


def gossip_sweep(ps: Sequence[int], sizes: Sequence[int], sw: Sweeper, out) -> dict:
    """Mean time of one gossip step (hypercube, rotating and fixed, over two periods) vs p,
    next to one ring and one torus all-reduce of the same buffer: per training step, each
    is what the gradients of that size cost."""
    from commrt.algorithms import Gossip
    variants = {"gossip (rotate)": Gossip(rotate=True), "gossip (fixed cube)": Gossip(rotate=False)}
    rep: dict = {}
    for nbytes in sizes:
        out(f"\n## gossip step vs all-reduce per training step · {fmt_bytes(nbytes)} "
            f"(off-node: share of gossip messages that leave their node)")
        out(f"{'p':>6} " + "".join(f"{n:>12}" for n in GOSSIP_COMPARE)
            + "".join(f"{n:>22}{'off-node':>10}" for n in variants))
        rows = {n: [] for n in (*GOSSIP_COMPARE, *variants)}
        for p in ps:
            cells = []
            for n in GOSSIP_COMPARE:
                t = sw.time(n, p, nbytes)[0]
                rows[n].append((t, None))
                cells.append(f"{_fmt_time(t):>12}")
            for n, g in variants.items():
                r = sim.simulate_gossip(g, p, nbytes, sw.net)
                rows[n].append((r.mean_s, r.off_node_share))
                cells.append(f"{_fmt_time(r.mean_s):>22}{r.off_node_share:>10.0%}")
            out(f"{p:>6} " + "".join(cells))
        rep[nbytes] = rows
    return rep


def plot_gossip(report: dict, args, net: sim.Network) -> str:
    ps = report["p"]
    sizes = list(report["gossip"])
    styles = {"ring": "o-", "torus2d": "^-", "gossip (rotate)": "D-", "gossip (fixed cube)": "v--"}
    fig, axes = plotting.figure(len(sizes), (6.2 * len(sizes), 4.6))
    for ax, nbytes in zip(axes, sizes):
        for n, vals in report["gossip"][nbytes].items():
            ms = np.array([t for t, _ in vals]) * 1e3
            ax.plot(ps, ms, styles.get(n, ".-"), label=n, markersize=4)
        plotting.style(ax, xlabel="ranks p", ylabel="communication per training step (ms)",
                       logy=True, title=f"{fmt_bytes(nbytes)} of gradients: one gossip step vs one all-reduce")
    fig.suptitle(f"simulated gossip vs all-reduce · {net.describe()}", fontsize=9)
    return plotting.save(fig, os.path.join(args.out_dir, FILES["gossip"]))


def cmd_simulate(args) -> int:
    run(args, out=lambda msg: print(msg, flush=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="commrt simulate", description=__doc__.split("\n\n")[0].replace("``", ""))
    add_arguments(parser)
    args = parser.parse_args(argv)
    return cmd_simulate(args)


if __name__ == "__main__":
    sys.exit(main())
