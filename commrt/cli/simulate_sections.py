"""The sections of ``commrt simulate``: what each one sweeps and how it prints.

A section is a generator of rows (``*_rows``: data only, built on :mod:`commrt.sim`),
a header and one line per row (rendering), and a function that streams the rows
to ``out`` as they are computed (a full sweep takes tens of seconds) and returns
the section's part of the report. The figures are in :mod:`commrt.cli.simulate_plots`.
"""

from __future__ import annotations

import re
import textwrap
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from commrt import sim
from commrt.algorithms import Gossip, PipelinedTorus2D, Torus2D, resolve
from commrt.algorithms.auto import candidates, label
from commrt.cli.units import fmt_bytes

#: the column of about 2% of p backup workers; the table also shows its b per p
TWO_PERCENT = "b≈2%"
#: the b columns of the backup tables (:func:`backup_counts`)
BACKUP_LABELS = ("b=0", "b=1", "b=2", TWO_PERCENT)
#: the all-reduces a gossip step is compared with
GOSSIP_COMPARE = ("ring", "torus2d")
GOSSIP_VARIANTS = {
    "gossip (rotate)": Gossip(rotate=True),
    "gossip (fixed cube)": Gossip(rotate=False),
}


def size_sweep(p: int, itemsize: int = 4) -> tuple[int, ...]:
    """Message sizes ×4 from the first power of two ≥ one element per chunk (p·itemsize) to
    1 GiB.

    Smaller buffers leave chunks empty, and empty chunks send nothing.
    """
    k = max(3, (p * itemsize - 1).bit_length())
    return tuple(1 << j for j in range(k, 31, 2))


@dataclass(frozen=True)
class StepSetup:
    """The training step the straggler and backup sections sample (from the arguments)."""

    compute_ms: float
    delay_ms: float  # mean per-rank delay
    samples: int
    seed: int
    nbytes: int  # the all-reduce after compute: the largest swept size

    @classmethod
    def from_args(cls, args) -> "StepSetup":
        return cls(args.compute_ms, args.delay_ms, args.samples, args.seed, max(args.sizes))

    @property
    def compute_s(self) -> float:
        return self.compute_ms * 1e-3

    @property
    def mean_s(self) -> float:
        return self.delay_ms * 1e-3


# ------------------------------------------------------- pricing
class Sweeper:
    """Simulates (algorithm, p, nbytes) once; ``auto`` reuses the candidates' results."""

    def __init__(self, network: sim.Network, progress=None):
        self.net = network
        self.memo: dict = {}
        self.progress = progress or (lambda msg: None)

    def _alg(self, name: str, p: int):
        alg = resolve(name)
        if isinstance(alg, (Torus2D, PipelinedTorus2D)):  # one row per node, as a launch picks
            return type(alg)(*alg.shape(p, local_size=self.net.ranks_per_node))
        return alg

    def time(self, name: str, p: int, nbytes: int) -> tuple[float, str]:
        """(seconds, label) of one all-reduce; ``auto`` gives its choice's label."""
        if name == "auto":
            return self._auto(p, nbytes)
        alg = self._alg(name, p)
        return self._price(alg, label(alg), p, nbytes), label(alg)

    def fastest(self, names: Sequence[str], p: int, nbytes: int) -> tuple[float, str]:
        """(seconds, label) of the fastest of ``names`` (ties: the smaller label)."""
        return min(self.time(n, p, nbytes) for n in names)

    def _price(self, alg, lab: str, p: int, nbytes: int) -> float:
        key = (lab, p, nbytes)
        if key not in self.memo:
            t0 = time.perf_counter()
            self.memo[key] = sim.estimate(alg, p, nbytes, self.net)
            if time.perf_counter() - t0 > 1.0:
                self.progress(
                    f"# simulating {lab} at p={p}, {fmt_bytes(nbytes)} took "
                    f"{time.perf_counter() - t0:.1f} s"
                )
        return self.memo[key]

    def _auto(self, p: int, nbytes: int) -> tuple[float, str]:
        # Auto.choose's ranking (sim.price_all over its candidates, ties to the earlier one),
        # sharing this sweep's memo so no schedule is simulated twice.
        algs = candidates(p)
        times = sim.price_all(
            algs, p, nbytes, self.net, price=lambda a: self._price(a, label(a), p, nbytes)
        )
        t, _, alg = min((t, i, a) for i, (t, a) in enumerate(zip(times, algs)) if t is not None)
        return t, label(alg)


def fmt_time(t: float) -> str:
    """``t`` seconds in the unit that gives it three digits (s, ms or µs), for a table."""
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def crossover(sizes: Sequence[int], times: Sequence[float]) -> int | None:
    """First size whose time is at least twice the smallest size's: where β starts to
    dominate α."""
    t0 = times[0]
    for n, t in zip(sizes, times):
        if t >= 2 * t0:
            return n
    return None


def backup_counts(p: int) -> dict[str, int]:
    """The b values compared at ``p`` ranks: 0, 1, 2 and about 2% of p (at least 1), all < p."""
    bs = dict(zip(BACKUP_LABELS, (0, 1, 2, max(1, round(0.02 * p)))))
    return {k: b for k, b in bs.items() if b < p}


#: the widest line any section prints
WIDTH = 80


def fit(text: str, width: int = WIDTH) -> str:
    """``text`` (a title, leading newlines kept) wrapped to ``width`` columns, continuation
    lines indented under it."""
    body = text.lstrip("\n")
    if len(body) <= width:
        return text
    lead = text[: len(text) - len(body)]
    indent = "#  " if body.startswith("#") else "   "
    # a number keeps its unit on its line ("370 GB/s", not "370" then "GB/s"): the space
    # between them is a no-break space while wrapping (textwrap breaks on ASCII spaces only)
    body = _NUMBER_UNIT.sub("\\1\u00a0", body)
    wrapped = textwrap.fill(body, width, subsequent_indent=indent, break_on_hyphens=False)
    return lead + wrapped.replace("\u00a0", " ")


#: a number and the space before its unit
_NUMBER_UNIT = re.compile(r"(\d[\d.,]*) (?=(?:[kMGT]?B/s|[KMGT]iB|µs|ms|ns|s|%)(?!\w))")


def short(name: str, width: int = 10) -> str:
    """A column label: the name, or the initials of its parts when wider (halving_doubling: hd)."""
    return name if len(name) <= width else "".join(w[0] for w in name.split("_"))[:width]


def legend(names: Sequence[str], width: int = 10) -> list[str]:
    """A line naming the abbreviated columns, if any."""
    pairs = [f"{short(n, width)} = {n}" for n in names if short(n, width) != n]
    return [fit("# " + ", ".join(pairs))] if pairs else []


def stream(
    out: Callable[[str], None], header: Sequence[str], rows: Iterable, line: Callable[..., str]
) -> list:
    """Print ``header``, then each row as ``line(row)`` as soon as it is computed; the rows."""
    for h in header:
        out(fit(h).rstrip())
    kept = []
    for row in rows:
        kept.append(row)
        out(line(row).rstrip())
    return kept


# ------------------------------------------------------- time per all-reduce vs p
def vs_p_rows(
    sw: Sweeper, names: Sequence[str], ps: Sequence[int], nbytes: int
) -> Iterator[tuple[int, dict]]:
    """Per p: (p, {algorithm: (seconds, label)})."""
    for p in ps:
        yield p, {n: sw.time(n, p, nbytes) for n in names}


def choice(lab: str, width: int = 18) -> str:
    """``auto``'s choice in its column: a family name too wide for it goes by its initials
    (``torus2d_pipelined(2x8,s16,ring)``: ``tp(2x8,s16,ring)``; :data:`CHOICE_LEGEND`)."""
    name, paren, rest = lab.partition("(")
    return lab if len(lab) <= width else short(name, 4) + paren + rest


#: names :func:`choice` abbreviates, under a table that shows one (:func:`choice_legend`)
CHOICE_LEGEND = "# auto's choice: tp = torus2d_pipelined"


def choice_legend(labels: Iterable[str]) -> list[str]:
    """:data:`CHOICE_LEGEND`, if :func:`choice` abbreviated one of ``labels`` (printed under
    the table, whose rows are streamed: a legend above one that had no tp misled)."""
    return [CHOICE_LEGEND] if any(choice(lab) != lab for lab in labels) else []


def vs_p_header(names: Sequence[str], nbytes: int) -> list[str]:
    return [
        f"\n## time per all-reduce vs p · {fmt_bytes(nbytes)}",
        *legend(names),
        f"{'p':>6}"
        + "".join(
            f"{n:>10} {'(its choice)':<18}" if n == "auto" else f"{short(n):>11}" for n in names
        ),
    ]


def vs_p_line(p: int, cells: dict) -> str:
    return f"{p:>6}" + "".join(
        f"{fmt_time(t):>10} {choice(lab):<18}" if n == "auto" else f"{fmt_time(t):>11}"
        for n, (t, lab) in cells.items()
    )


def vs_p_section(sw: Sweeper, names: Sequence[str], ps: Sequence[int], nbytes: int, out) -> dict:
    """{algorithm: [(seconds, label) per p]} for one size."""
    rows = stream(
        out,
        vs_p_header(names, nbytes),
        vs_p_rows(sw, names, ps, nbytes),
        lambda row: vs_p_line(*row),
    )
    for line in choice_legend(cells["auto"][1] for _, cells in rows if "auto" in cells):
        out(line)
    return {n: [cells[n] for _, cells in rows] for n in names}


# ------------------------------------------------------- time vs size at one p
def vs_size_rows(
    sw: Sweeper, names: Sequence[str], p: int, sizes: Sequence[int]
) -> Iterator[tuple[int, dict, str]]:
    """Per size: (size, {algorithm: seconds}, the fastest choice: ``auto``'s if swept, else
    the first of the fastest, as the table reads left to right)."""
    plain = [n for n in names if n != "auto"]
    for nbytes in sizes:
        priced = {n: sw.time(n, p, nbytes) for n in names}
        if "auto" in priced:
            fastest = priced["auto"][1]
        else:
            fastest = min(
                ((priced[n][0], i, priced[n][1]) for i, n in enumerate(plain)), default=(0, 0, "")
            )[2]
        yield nbytes, {n: t for n, (t, _) in priced.items()}, fastest


def vs_size_line(nbytes: int, times: dict, fastest: str) -> str:
    cells = "".join(f"{fmt_time(t):>11}" for t in times.values())
    return f"{fmt_bytes(nbytes):>8}{cells}  {choice(fastest)}"


def crossover_lines(sizes: Sequence[int], crossovers: dict) -> list[str]:
    lines = [
        f"latency-bound below, bandwidth-bound above (time = 2× the {fmt_bytes(sizes[0])} time):"
    ]
    for n, c in crossovers.items():
        lines.append(f"  {n:<18} {fmt_bytes(c) if c else '> ' + fmt_bytes(sizes[-1])}")
    return lines


def vs_size_section(sw: Sweeper, names: Sequence[str], p: int, out) -> dict:
    """Time per size at ``p`` ranks and where each algorithm turns bandwidth-bound."""
    sizes = size_sweep(p)
    header = [
        f"\n## time vs message size at p={p}",
        *legend(names),
        f"{'size':>8}" + "".join(f"{short(n):>11}" for n in names) + "  fastest",
    ]
    rows = stream(out, header, vs_size_rows(sw, names, p, sizes), lambda row: vs_size_line(*row))
    for line in choice_legend(fastest for _, _, fastest in rows):
        out(line)
    times = {n: [t[n] for _, t, _ in rows] for n in names}
    cross = {n: crossover(sizes, times[n]) for n in names}
    for line in crossover_lines(sizes, cross):
        out(line)
    return {
        "p": p,
        "sizes": list(sizes),
        "times": times,
        "crossover": cross,
        "fastest": [f for _, _, f in rows],
    }


# ------------------------------------------------------- synchronous steps
def straggler_delays(mean_s: float) -> list:
    """No delay, then three delays of mean ``mean_s`` with ever heavier tails."""
    return [
        sim.NoDelay(),
        sim.Exponential.from_mean(mean_s),
        sim.LogNormal.from_mean(mean_s),
        sim.Pareto.from_mean(mean_s),
    ]


def straggler_rows(
    sw: Sweeper, algs: Sequence[str], ps: Sequence[int], setup: StepSetup, delays: Sequence
) -> Iterator[tuple[int, dict]]:
    """Per p: (p, {delay: the sampled synchronous steps}), the slowest rank setting the
    start, the fastest of ``algs`` as the all-reduce."""
    for p in ps:
        t_coll = sw.fastest(algs, p, setup.nbytes)[0]
        yield (
            p,
            {
                str(d): sim.simulate_backup(
                    p,
                    t_coll,
                    (0,),
                    compute_s=setup.compute_s,
                    delay=d,
                    samples=setup.samples,
                    seed=setup.seed,
                )[0]
                for d in delays
            },
        )


def delay_label(d) -> str:
    """A column label for a delay: its kind (the section's title gives its parameters)."""
    name = str(d).split("(")[0]
    return name if len(name) <= 17 else name[:17]


def straggler_line(p: int, steps: dict) -> str:
    cells = (f"{fmt_time(s.mean_s)} / {fmt_time(s.p99_s)}" for s in steps.values())
    return f"{p:>6}" + "".join(f"{c:>18}" for c in cells)


def straggler_section(
    sw: Sweeper, algs: Sequence[str], ps: Sequence[int], setup: StepSetup, out
) -> dict:
    delays = straggler_delays(setup.mean_s)
    header = [
        f"\n## synchronous step: {setup.compute_ms:g} ms compute + per-rank delay (mean "
        f"{setup.delay_ms:g} ms) + all-reduce of {fmt_bytes(setup.nbytes)} (fastest "
        f"algorithm), {setup.samples} samples; mean / p99 per delay: "
        + ", ".join(str(d) for d in delays[1:]),
        f"{'p':>6}" + "".join(f"{delay_label(d):>18}" for d in delays),
    ]
    rows = stream(
        out, header, straggler_rows(sw, algs, ps, setup, delays), lambda row: straggler_line(*row)
    )
    per_delay = {
        str(d): {
            "mean": [steps[str(d)].mean_s for _, steps in rows],
            "p99": [steps[str(d)].p99_s for _, steps in rows],
        }
        for d in delays
    }
    return {"delays": per_delay, "compute_s": setup.compute_s}


# ------------------------------------------------------- backup workers
def backup_rows(
    sw: Sweeper, algs: Sequence[str], ps: Sequence[int], setup: StepSetup, delay
) -> Iterator[tuple[int, dict]]:
    """Per p: (p, {b label: sampled steps, or None where b is not below p}). A step starts at
    the N-th of p = N + b arrivals (:func:`commrt.sim.simulate_backup`), then the all-reduce
    among the N runs, priced as the p-rank one (b ≤ 2% of p changes it by little and
    equally for every b compared)."""
    for p in ps:
        counts = backup_counts(p)
        t_coll = sw.fastest(algs, p, setup.nbytes)[0]
        stats = dict(
            zip(
                counts,
                sim.simulate_backup(
                    p,
                    t_coll,
                    tuple(counts.values()),
                    compute_s=setup.compute_s,
                    delay=delay,
                    samples=setup.samples,
                    seed=setup.seed,
                ),
            )
        )
        yield p, {k: stats.get(k) for k in BACKUP_LABELS}


def backup_line(p: int, stats: dict) -> str:
    cells = [
        "—" if s is None else f"{fmt_time(s.mean_s)} / {fmt_time(s.p99_s)}" for s in stats.values()
    ]
    cells = [f"{c:>17}" for c in cells]
    return f"{p:>5}" + "".join(cells) + f"{backup_counts(p).get(TWO_PERCENT, 0):>6}"


def backup_section(
    sw: Sweeper, algs: Sequence[str], ps: Sequence[int], setup: StepSetup, out
) -> dict:
    """Per delay (exponential and Pareto), per b: mean, p99 and b per p (None: no such b)."""
    res: dict = {}
    for d in (sim.Exponential.from_mean(setup.mean_s), sim.Pareto.from_mean(setup.mean_s)):
        header = [
            f"\n## backup workers · {setup.compute_ms:g} ms compute + {d} per rank, "
            f"first N of p = N + b (mean / p99)",
            f"{'p':>5}" + "".join(f"{k:>17}" for k in BACKUP_LABELS) + f"{'2%→b':>6}",
        ]
        rows = stream(
            out, header, backup_rows(sw, algs, ps, setup, d), lambda row: backup_line(*row)
        )
        res[str(d)] = {k: _backup_columns([stats[k] for _, stats in rows]) for k in BACKUP_LABELS}
    return {"delays": res, "compute_s": setup.compute_s}


def _backup_columns(stats: Sequence) -> dict:
    """Mean, p99 and b per p of one b column (None where that b is not below p)."""

    def col(attr: str) -> list:
        return [None if s is None else getattr(s, attr) for s in stats]

    return {"mean": col("mean_s"), "p99": col("p99_s"), "b": col("backups")}


# ------------------------------------------------------- gossip
def gossip_rows(sw: Sweeper, ps: Sequence[int], nbytes: int) -> Iterator[tuple[int, dict]]:
    """Per p: (p, {name: (seconds, off-node share or None)}): one gossip step (hypercube,
    rotating and fixed, mean over two periods) next to one ring and one torus all-reduce of
    the same buffer; per training step, each is what the gradients of that size cost."""
    for p in ps:
        row = {n: (sw.time(n, p, nbytes)[0], None) for n in GOSSIP_COMPARE}
        for n, g in GOSSIP_VARIANTS.items():
            r = sim.simulate_gossip(g, p, nbytes, sw.net)
            row[n] = (r.mean_s, r.off_node_share)
        yield p, row


#: column labels of the gossip variants
GOSSIP_LABELS = {"gossip (rotate)": "rotate", "gossip (fixed cube)": "fixed cube"}


def gossip_line(p: int, row: dict) -> str:
    cells = [f"{fmt_time(row[n][0]):>11}" for n in GOSSIP_COMPARE]
    cells += [f"{fmt_time(row[n][0]):>12}{row[n][1]:>10.0%}" for n in GOSSIP_VARIANTS]
    return f"{p:>6}" + "".join(cells)


def gossip_section(sw: Sweeper, ps: Sequence[int], sizes: Sequence[int], out) -> dict:
    """Per size: {name: [(seconds, off-node share or None) per p]}."""
    rep: dict = {}
    for nbytes in sizes:
        header = [
            f"\n## gossip step vs all-reduce per training step · {fmt_bytes(nbytes)} "
            f"(rotate, fixed cube: one gossip step on a rotating or a fixed hypercube; "
            f"off-node: share of its messages that leave their node)",
            f"{'p':>6}"
            + "".join(f"{n:>11}" for n in GOSSIP_COMPARE)
            + "".join(f"{GOSSIP_LABELS.get(n, n):>12}{'off-node':>10}" for n in GOSSIP_VARIANTS),
        ]
        rows = stream(out, header, gossip_rows(sw, ps, nbytes), lambda row: gossip_line(*row))
        rep[nbytes] = {n: [row[n] for _, row in rows] for n in (*GOSSIP_COMPARE, *GOSSIP_VARIANTS)}
    return rep
