"""``commrt simulate``: all-reduce at scale, on paper.

Sweeps world size p (2 … ``--max-p``, powers of two) and message size
through :func:`commrt.sim.simulate` (the real schedules of ring,
halving-doubling, 2D torus and ``auto``), prints tables and writes five
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
* (no figure) backup workers' control plane: the store's cost per global
  step (arrival and gloo's commit) for p = 4 … ``--max-p``, flat and with a
  leader per node (:mod:`commrt.cli.simulate_control`, ``--store-cost``).
* ``sim_gossip_vs_p.png``: one gossip step (GossipGraD's one-peer exchange,
  hypercube with and without rotation, mean over two periods) vs one ring
  and one torus all-reduce of the same buffer, per size, vs p.

Each section is one function that returns data (``sweep_*``, built on
:mod:`commrt.sim`), one that renders it as text (``render_*``), and one figure
in :mod:`commrt.cli.simulate_plots`. It runs in one process (never relaunched
as ranks); ``--only`` runs some sections alone (``--only control``: the
control plane's table). ``commrt.cli.commands`` adds it with :func:`register`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

from commrt import sim
from commrt.algorithms import resolve
from commrt.cli import simulate_control
from commrt.cli.extras import require
from commrt.cli.simulate_deadline import deadline_section
from commrt.cli.simulate_plots import FILES, plot_all
from commrt.cli.simulate_sections import (
    StepSetup,
    Sweeper,
    backup_counts,
    backup_section,
    crossover,
    fit,
    gossip_section,
    size_sweep,
    straggler_section,
    vs_p_section,
    vs_size_section,
)
from commrt.cli.units import (
    fmt_bytes,
    named,
    non_negative_number,
    output_file,
    output_folder,
    positive_int,
    size_list,
    whole_number,
)
from commrt.schedule import Collective

# the sections' helpers stay importable from here, where they used to live
__all__ = [
    "run",
    "register",
    "add_arguments",
    "figures_wanted",
    "network_from_args",
    "allreduce_names",
    "FILES",
    "Sweeper",
    "StepSetup",
    "size_sweep",
    "crossover",
    "backup_counts",
    "fmt_bytes",
]

DEFAULT_ALGORITHMS = "ring,halving_doubling,torus2d,auto"
#: the sections, in the order they run (all but control draw a figure)
SECTIONS = ("vs-p", "vs-size", "stragglers", "backup", "control", "gossip", "gossip-deadline")


# ------------------------------------------------------------------ parsing
@named("power of two")
def _pow2(text: str) -> int:
    v = whole_number(text)
    if v < 2 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two >= 2, got {v}")
    return v


@named("section list")
def _sections(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    if not names or any(s not in SECTIONS for s in names):
        raise argparse.ArgumentTypeError(
            f"give sections among {', '.join(SECTIONS)}, comma-separated; got {text!r}"
        )
    return names


#: the default run's knobs, a few seconds: (--max-p, --at-p, --samples); --full's, about a
#: minute on two busy cores, the paper-scale sweep the docs' figures come from
SHORT = (64, 64, 100)
FULL = (4096, 1024, 400)


def _scope_flags(p: argparse.ArgumentParser) -> None:
    """The sweep's size: --full, and the knobs it sets (:func:`scoped` fills them in)."""
    p.add_argument(
        "--full",
        action="store_true",
        help=f"the long sweep: --max-p {FULL[0]}, --at-p {FULL[1]}, --samples {FULL[2]} "
        f"(about a minute; default a short run: {SHORT[0]}, {SHORT[1]}, {SHORT[2]})",
    )
    p.add_argument(
        "--max-p",
        type=_pow2,
        default=None,
        help=f"largest world size (power of two; default {SHORT[0]}, {FULL[0]} with --full)",
    )
    p.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        help=f"sampled steps per point (default {SHORT[2]}, {FULL[2]} with --full)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    _scope_flags(p)
    p.add_argument(
        "--sizes",
        type=size_list,
        default=[64 << 10, 256 << 20],
        help="message sizes for the time-vs-p sweep (default 64K,256M)",
    )
    p.add_argument(
        "--at-p",
        type=_pow2,
        default=None,
        help=f"world size of the time-vs-size sweep (default {SHORT[1]}, {FULL[1]} with --full)",
    )
    p.add_argument(
        "--network",
        default="h100",
        help="'h100' (NVLink4 + NDR IB preset, sources in commrt.sim), "
        "'flat:ALPHA_US,GBPS', or a JSON file (a commrt.tuning.probe result or "
        "Network.to_dict()); default: %(default)s",
    )
    p.add_argument(
        "--ranks-per-node",
        type=positive_int,
        default=None,
        help="override the network's ranks per node",
    )
    p.add_argument(
        "--nics-per-node",
        type=positive_int,
        default=None,
        help="override the network's NICs per node",
    )
    p.add_argument(
        "--algorithms",
        default=DEFAULT_ALGORITHMS,
        help=f"comma-separated (default {DEFAULT_ALGORITHMS}); torus2d takes one row per node",
    )
    p.add_argument(
        "--compute-ms",
        type=non_negative_number,
        default=100.0,
        help="compute per training step (default 100 ms)",
    )
    p.add_argument(
        "--delay-ms",
        type=non_negative_number,
        default=5.0,
        help="mean per-rank delay (default 5 ms)",
    )
    p.add_argument("--seed", type=int, default=0)
    simulate_control.add_arguments(p)
    p.add_argument(
        "--only",
        metavar="SECTION,...",
        type=_sections,
        default=SECTIONS,
        help=f"run only these sections: {', '.join(SECTIONS)} (default all)",
    )
    p.add_argument(
        "--out-dir",
        default="out/sim",
        type=output_folder,
        help="where the PNGs go (default out/sim)",
    )
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument(
        "--json",
        metavar="PATH",
        type=output_file,
        help="also write every swept number (unrounded) as JSON",
    )


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``simulate`` to a ``commrt`` sub-command parser (single-process: no relaunch)."""
    p = subparsers.add_parser(
        "simulate",
        help="all-reduce at scale under an α-β network model (plots)",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    add_arguments(p)
    p.set_defaults(run=cmd_simulate, single_process=True, parser=p)
    return p


def network_from_args(args) -> sim.Network:
    """The network ``--network`` names, with the ranks and NICs per node overridden if given."""
    spec = args.network
    if spec == "h100":
        net = sim.Network.h100_nvlink_ib()
    elif spec.startswith("flat:"):
        try:
            a, bw = (float(x) for x in spec[5:].split(","))
        except ValueError:
            raise SystemExit(
                f"commrt simulate: --network flat:ALPHA_US,GBPS, got {spec!r}"
            ) from None
        try:
            link = sim.Link.from_bandwidth(a, bw)
        except ValueError as e:
            raise SystemExit(f"commrt simulate: --network {spec}: {e}") from None
        net = sim.Network(link, link, 1, 1, spec)
    elif os.path.exists(spec):
        try:
            net = sim.Network.load(spec)
        except (ValueError, TypeError, KeyError) as e:  # json's errors are ValueErrors
            raise SystemExit(
                f"commrt simulate: --network {spec} is not a network file ({e})"
            ) from None
    else:
        raise SystemExit(
            f"commrt simulate: --network must be h100, flat:ALPHA_US,GBPS or a "
            f"JSON file; {spec!r} is none of them"
        )
    if args.ranks_per_node is not None:
        net = dataclasses.replace(net, ranks_per_node=args.ranks_per_node)
    if args.nics_per_node is not None:
        net = dataclasses.replace(net, nics_per_node=args.nics_per_node)
    return net


def allreduce_names(text: str) -> list[str]:
    """The comma-separated ``--algorithms``, each an all-reduce (else SystemExit)."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    for n in names:
        if not resolve(n).supports(Collective.ALL_REDUCE):
            raise SystemExit(
                f"commrt simulate: {n} is not an all-reduce; gossip has a section of its own"
            )
    return names


# ---------------------------------------------------------------------- run
def figures_wanted(args) -> bool:
    """Whether this run draws figures (matplotlib): plots are on and a section that has
    one runs."""
    return not args.no_plots and any(s != "control" for s in args.only)


def scoped(args) -> argparse.Namespace:
    """``args`` with the sweep's knobs the user left out filled in: the short run's, or
    with ``--full`` the long one's (a given knob stands either way)."""
    if "short_run" in vars(args):  # scoped already
        return args
    given = (args.max_p, args.at_p, args.samples)
    wanted = FULL if args.full else SHORT
    max_p, at_p, samples = (w if g is None else g for g, w in zip(given, wanted))
    short = wanted is SHORT and given[0] is None  # said under the tables
    knobs = {"max_p": max_p, "at_p": at_p, "samples": samples, "short_run": short}
    return argparse.Namespace(**{**vars(args), **knobs})


def run(args, out=print) -> dict:
    """Every section (``--only``: those) in turn, each table printed row by row as it is
    swept; then the figures. Returns the report the figures are drawn from."""
    args = scoped(args)
    net = network_from_args(args)
    names = allreduce_names(args.algorithms)
    setup = StepSetup.from_args(args)
    ps = [1 << k for k in range(1, args.max_p.bit_length())]
    algs = [n for n in names if n != "auto"] or ["ring"]
    out = _notes_after_tables(out, held := [])
    sw = Sweeper(net, progress=held.append)
    t_start = time.perf_counter()
    out(fit(f"# commrt simulate · network {net.describe()}"))
    out("# model: α-β per link class, NICs shared per node, per-rank clocks")
    out("# (commrt.sim docstring)")
    report: dict = {"network": net.to_dict(), "p": ps}
    only = args.only
    if "vs-p" in only:
        report["vs_p"] = {n: vs_p_section(sw, names, ps, n, out) for n in args.sizes}
    if "vs-size" in only:
        report["vs_size"] = vs_size_section(sw, names, args.at_p, out)
    if "stragglers" in only:
        report["stragglers"] = straggler_section(sw, algs, ps, setup, out)
    if "backup" in only:
        report["backup"] = backup_section(sw, algs, ps, setup, out)
    if "control" in only:
        report["control"] = simulate_control.control_section(
            ps, args.store_cost, net.ranks_per_node, setup.compute_s, out
        )
    if "gossip" in only:
        report["gossip"] = gossip_section(sw, ps, args.sizes, out)
    if "gossip-deadline" in only:
        report["gossip_deadline"] = deadline_section(sw, algs, ps, setup, out)
    out(f"\n# swept in {time.perf_counter() - t_start:.1f} s")
    if args.short_run:
        out(f"# a short run, p up to {args.max_p}: --full sweeps p up to {FULL[0]}")
    if figures_wanted(args):
        os.makedirs(args.out_dir, exist_ok=True)
        paths = plot_all(report, names, args.out_dir, net.describe())
        for path in paths:
            out(f"# wrote {os.path.abspath(path)}")
        report["files"] = paths
    if args.json:
        write_json(report, args.json)
        out(f"# wrote {args.json}")
    return report


def _notes_after_tables(out, held: list[str]):
    """``out`` that prints the notes put in ``held`` (a slow simulation's time) before the
    next section's title or the closing line, not between a table's rows."""

    def emit(msg: str) -> None:
        if msg.startswith("\n") and held:
            for note in held:
                out(fit(note))
            held.clear()
        out(msg)

    return emit


def write_json(report: dict, path: str) -> None:
    """The report as JSON: every number the tables round or leave out."""
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=lambda o: getattr(o, "__dict__", str(o)))


def cmd_simulate(args) -> int:
    if figures_wanted(args):  # before the sweeps, not after them
        require("commrt simulate", "matplotlib", "matplotlib", ", or pass --no-plots")
    run(args, out=lambda msg: print(msg, flush=True))
    return 0
