"""``auto`` against every candidate it chooses from, measured; and the model's error.

Run on namespace hosts (tests/netns.py, root), e.g. 4 hosts × 2 ranks at 1 Gbit/s::

    python tests/netns.py --hosts 4 --ranks-per-host 2 --rate 1gbit -- \\
        python bench/auto_vs_candidates.py --json out.json

(or ``mpiexec -n 4 python bench/auto_vs_candidates.py`` on one machine).
The ranks probe (:func:`commrt.probe.probe`), then for each size let
``auto`` settle (it learns from its own calls: ``commrt.algorithms.auto_learn``),
then time ``auto`` and every candidate of :func:`commrt.algorithms.auto.candidates`
in ``--rounds`` rounds, the order rotated each round so no candidate always
runs first after the others. A call's time is the slowest rank's (per
round, after a barrier); each figure is the median over rounds. Rank 0
prints per size and candidate: measured, predicted on the probed network
(:func:`commrt.sim.simulate` of the very schedule), error = (predicted −
measured) / measured; and auto's choice, its time over the fastest
candidate's: the median over rounds of auto's time over that candidate's
in the same round. The JSON has every row; ``--render FILE`` prints it as
the README's markdown table (measured / predicted ms, error). Also run by
``bench/auto_goal.py`` (namespace hosts, about half an hour).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
import time

import commrt
from commrt import sim
from commrt.algorithms import Auto
from commrt.algorithms.auto import candidates, choices, label, learning
from commrt.algorithms.auto_learn import calls_to_settle
from commrt.cli.bench import timing_buffer
from commrt.cli.units import size_list
from commrt.probe import probe
from commrt.rows import gather

DEFAULT_SIZES = "64K,1M,16M,64M"


def calls_for(nbytes: int) -> int:
    """Calls per timed run: about 32 MiB of buffer, 1 to 20 calls."""
    return max(1, min(20, (32 << 20) // nbytes))


def timed(comm, fn, iters: int) -> float:
    """Seconds per call of ``fn``, the slowest rank's (barrier-aligned; collective)."""
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = (time.perf_counter() - t0) / iters
    return max(r[0] for r in gather(comm, [mine]))


def settle_auto(comm, nbytes: int, fn) -> int:
    """Call ``auto`` (``fn``) until it settles on a schedule for ``nbytes`` (its watch and,
    if it missed, its trial and rematch); the calls made. A timing of auto's calls before
    then would time its trial of the other candidates, not its choice."""
    most = calls_to_settle(len(candidates(comm.world_size)))
    for made in range(1, most + 1):
        fn()
        if learning(comm)[nbytes].phase == "settled":
            return made
    return most


def measure_size(comm, nbytes: int, rounds: int, net) -> dict:
    p = comm.world_size
    x = timing_buffer(nbytes // 4)
    auto = Auto()
    settle_auto(comm, nbytes, lambda: commrt.all_reduce(x, comm, algorithm=auto, op="sum"))
    algs = {label(a): a for a in candidates(p)}
    names = [*algs, "auto"]
    run = {
        n: (lambda a=a: commrt.all_reduce(x, comm, algorithm=a, op="sum")) for n, a in algs.items()
    }
    run["auto"] = lambda: commrt.all_reduce(x, comm, algorithm=auto, op="sum")
    iters = calls_for(nbytes)
    for n in names:
        run[n]()  # warm-up: plan, scratch
    times: dict[str, list[float]] = {n: [] for n in names}
    # small calls take milliseconds, and one burst of another process moves them by tens of
    # percent: more rounds where they are cheap
    for k in range(rounds if nbytes >= 4 << 20 else 2 * rounds + 1):
        for n in names[k % len(names) :] + names[: k % len(names)]:
            times[n].append(timed(comm, run[n], iters))
    measured = {n: statistics.median(t) for n, t in times.items()}
    predicted = {
        n: sim.simulate(a.select(p, nbytes, comm), nbytes=nbytes, network=net).time_s
        for n, a in algs.items()
    }
    choice = choices(comm)[nbytes]
    predicted["auto"] = predicted[choice.label]
    tuning = learning(comm)[nbytes]
    fastest = min(algs, key=lambda n: measured[n])
    # auto over the fastest, paired by round (each round's two runs met the same load on this
    # shared machine): settled, auto runs one candidate's schedule, and unpaired medians of
    # two runs of that very schedule differed by up to 15% under a load of 10
    paired = statistics.median(a / f for a, f in zip(times["auto"], times[fastest]))
    # the same for the candidate auto chose, timed as a candidate: once auto has settled it
    # runs that very schedule, so this is its choice's cost with twice the samples' worth
    # of noise taken out of the comparison (the raw ratio is kept beside it)
    picked = statistics.median(c / f for c, f in zip(times[choice.label], times[fastest]))
    return dict(
        nbytes=nbytes,
        measured=measured,
        spread={n: [min(t), max(t)] for n, t in times.items()},
        predicted=predicted,
        error={n: (predicted[n] - measured[n]) / measured[n] for n in names},
        choice=choice.label,
        learned=choice.learned,
        model_choice=tuning.choice,
        tuning=str(tuning),
        fastest=fastest,
        auto_over_best=paired,
        choice_over_best=picked,
    )


def markdown(rows: list[dict], title: str) -> str:
    """The model-error table of one run's JSON rows, as the README shows it."""
    names = [n for n in rows[0]["measured"] if n != "auto"]
    out = [
        f"| {title} | " + " | ".join(names) + " | auto's choice |",
        "|---" * (len(names) + 2) + "|",
    ]
    for r in rows:
        cells = [
            f"{r['measured'][n] * 1e3:.1f} / {r['predicted'][n] * 1e3:.1f} ({r['error'][n] * 100:+.0f}%)"
            for n in names
        ]
        pick = r["choice"] + (" (learned)" if r["learned"] else "")
        size = f"{r['nbytes'] >> 10} KiB" if r["nbytes"] < 1 << 20 else f"{r['nbytes'] >> 20} MiB"
        out.append(f"| {size} | " + " | ".join(cells) + f" | {pick}, {r['auto_over_best']:.2f}× |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=size_list, default=size_list(DEFAULT_SIZES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--json", default=None, help="write the rows here (rank 0)")
    ap.add_argument("--render", metavar="JSON", help="print a run's --json as a markdown table")
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            d = json.load(f)
        p = d["probe"]
        print(
            markdown(d["rows"], f"{p['world_size'] // p['ranks_per_node']} × {p['ranks_per_node']}")
        )
        return 0
    comm = commrt.init(args.backend, timeout=600)
    pr = probe(comm)
    net = pr.network()
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    for line in [f"{pr}", *(f"warning: {w}" for w in pr.warnings)]:
        say(textwrap.fill(line, 80, initial_indent="# ", subsequent_indent="#   "))
    # the longest label (torus2d_pipelined(2x4,s16,ring)) sets the column: 73 columns in all
    width = max(len(label(a)) for a in candidates(comm.world_size))
    say(f"{'size':>8} {'candidate':<{width}} {'measured':>11} {'predicted':>11} {'error':>8}")
    rows = []
    for nbytes in args.sizes:
        r = measure_size(comm, nbytes, args.rounds, net)
        rows.append(r)
        for n in r["measured"]:
            say(
                f"{nbytes >> 10:>7}K {n:<{width}} {r['measured'][n] * 1e3:9.2f}ms "
                f"{r['predicted'][n] * 1e3:9.2f}ms {r['error'][n] * 100:+7.1f}%"
            )
        verdict = (
            f"{nbytes >> 10}K: auto chose {r['choice']}"
            f"{' (learned; the model chose ' + r['model_choice'] + ')' if r['learned'] else ''}"
            f", {r['auto_over_best']:.3f}× the fastest ({r['fastest']}); its choice timed as a "
            f"candidate {r['choice_over_best']:.3f}×; {r['tuning']}"
        )
        say(textwrap.fill(verdict, 80, initial_indent="# ", subsequent_indent="#   "), flush=True)
    errs = [abs(e) for r in rows for n, e in r["error"].items() if n != "auto"]
    say(f"# |error| median {statistics.median(errs) * 100:.1f}%, max {max(errs) * 100:.1f}%")
    if comm.rank == 0 and args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"probe": pr.to_dict(), "rows": rows}, f, indent=1)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
