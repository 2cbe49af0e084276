"""``commrt simulate``'s gossip-deadline section: training steps of gossip with a
deadline, under the straggler delays of the backup section, against the all-reduce,
backup workers (b = 1) and plain gossip; with the staleness of the messages applied.

Every rank runs on its own clock (:func:`commrt.sim.simulate_gossip_deadline`):
plain gossip waits for each partner, so one slow rank slows its partner and,
within log2 p steps, everyone; with a deadline (``auto``, as the runtime
picks it) nobody waits past it and a late message is applied at a later step.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from commrt import sim
from commrt.algorithms import Gossip
from commrt.cli.simulate_sections import StepSetup, Sweeper, fmt_time, stream
from commrt.cli.units import fmt_bytes

#: the training steps each rank runs per simulated point
STEPS = 200
#: the table's columns after p: step times, then staleness shares
COLUMNS = ("all-reduce", "backup b=1", "gossip", "+deadline", "late 0", "1", "≥2")


def deadline_rows(
    sw: Sweeper, algs: Sequence[str], ps: Sequence[int], setup: StepSetup, delay
) -> Iterator[tuple[int, dict]]:
    """Per p: (p, {column: mean step seconds, or share of messages}), plus the deadline."""
    for p in ps:
        t_coll = sw.fastest(algs, p, setup.nbytes)[0]
        allreduce, backup = sim.simulate_backup(
            p,
            t_coll,
            (0, 1),
            compute_s=setup.compute_s,
            delay=delay,
            samples=setup.samples,
            seed=setup.seed,
        )
        runs = {
            d: sim.simulate_gossip_deadline(
                Gossip(),
                p,
                setup.nbytes,
                sw.net,
                compute_s=setup.compute_s,
                delay=delay,
                deadline_s=d,
                steps=STEPS,
                seed=setup.seed,
            )
            for d in (None, "auto")
        }
        late = runs["auto"]
        yield (
            p,
            {
                "all-reduce": allreduce.mean_s,
                "backup b=1": backup.mean_s,
                "gossip": runs[None].mean_s,
                "+deadline": late.mean_s,
                "late 0": late.stale_share(0),
                "1": late.stale_share(1),
                "≥2": late.stale_share(2, at_least=True),
                "deadline_s": late.deadline_s,
            },
        )


def deadline_line(p: int, row: dict) -> str:
    times = "".join(f"{fmt_time(row[c]):>11}" for c in COLUMNS[:4])
    shares = "".join(f"{row[c]:>7.1%}" for c in COLUMNS[4:])
    return f"{p:>5}{times}{shares}{fmt_time(row['deadline_s']):>9}"


def deadline_section(
    sw: Sweeper, algs: Sequence[str], ps: Sequence[int], setup: StepSetup, out
) -> dict:
    """Per delay (exponential and Pareto): {column: [value per p]}."""
    res: dict = {}
    for d in (sim.Exponential.from_mean(setup.mean_s), sim.Pareto.from_mean(setup.mean_s)):
        header = [
            f"\n## gossip with a deadline · {setup.compute_ms:g} ms compute + {d} per rank, "
            f"{fmt_bytes(setup.nbytes)}; mean step, then the share of messages applied "
            f"0, 1, ≥2 steps late (deadline auto: its value last)",
            f"{'p':>5}"
            + "".join(f"{c:>11}" for c in COLUMNS[:4])
            + "".join(f"{c:>7}" for c in COLUMNS[4:])
            + f"{'deadline':>9}",
        ]
        rows = stream(
            out, header, deadline_rows(sw, algs, ps, setup, d), lambda row: deadline_line(*row)
        )
        res[str(d)] = {k: [row[k] for _, row in rows] for k in (*COLUMNS, "deadline_s")}
    return {"delays": res, "compute_s": setup.compute_s, "steps": STEPS}
