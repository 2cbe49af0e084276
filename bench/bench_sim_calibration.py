"""Calibration: the simulator's prediction against measured all-reduce on this machine.

From the repository root, after ``pip install -e '.[dev]'``, on 2 and 4 ranks
over the mpi transport, or over gloo on hosts made of network namespaces
(tools/netns.py: 4 hosts × 2 ranks, 1 Gbit/s links; needs root)::

    mpiexec -n 2 python bench/bench_sim_calibration.py
    mpiexec -n 2 python bench/bench_sim_calibration.py --sizes 64K --repeats 2   # quick
    mpiexec -n 4 python bench/bench_sim_calibration.py --json calib_p4.json
    python tools/netns.py --hosts 4 --ranks-per-host 2 --rate 1gbit -- \
        python bench/bench_sim_calibration.py --sizes 16M,64M --iters 1 \
        --algorithms ring,torus2d,halving_doubling,auto

Each run probes α and β with :func:`commrt.tuning.probe.probe` (the same probe
``algorithm="auto"`` uses; both link classes when the ranks span hosts),
then for each algorithm (torus2d: its default grid, one row per host when
the launcher says how many ranks share a host) at a few sizes measures
``commrt.all_reduce`` (median of ``--repeats`` barrier-aligned runs, fixed
iteration counts on every rank, as in ``commrt bench allreduce``) and
predicts it with :func:`commrt.sim.simulate` of the very schedule that ran,
on ``probe(comm).network()``. Error = (predicted − measured) / measured.
The engine's own all-reduce (MPI_Allreduce, gloo's allreduce) is timed
beside them. Rank 0 prints the table. With more ranks than cores the
machine is oversubscribed: ranks wait for a core as well as for messages,
which a per-message α and a per-byte β describe only on average.

It is a script, not a pytest module (no test functions): the ranks must run
the same collectives in the same order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

import commrt
from commrt import sim
from commrt.algorithms import Torus2D, resolve
from commrt.cli.bench import iterations_for, time_calls, timing_buffer
from commrt.tuning.hook_comm import HookComm
from commrt.tuning.probe import probe

DEFAULT_SIZES = "64K,1M,16M"
DEFAULT_ALGORITHMS = "ring,torus2d,halving_doubling"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"comma-separated (default {DEFAULT_SIZES})"
    )
    ap.add_argument("--algorithms", default=DEFAULT_ALGORITHMS)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=None, help="calls per timed run (default by size)")
    ap.add_argument(
        "--backend",
        default="auto",
        help="auto (mpi under mpiexec, gloo under torchrun), mpi or gloo",
    )
    ap.add_argument("--json", default=None, help="also write the rows to this file (rank 0)")
    ap.add_argument(
        "--probe-file",
        default=None,
        help="write the probe result here (for commrt simulate --network)",
    )
    args = ap.parse_args(argv)
    from commrt.cli.units import parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    comm = commrt.init(args.backend, timeout=300)
    p = comm.world_size
    pr = probe(comm, repeats=args.repeats)
    net = pr.network()
    say = print if comm.rank == 0 else (lambda *a, **k: None)

    def note(text: str) -> None:
        """A ``#`` line, wrapped within 80 columns."""
        say(textwrap.fill(text, 80, initial_indent="# ", subsequent_indent="#     "))

    cores = os.cpu_count()
    native_name = {"mpi": "MPI_Allreduce", "gloo": "gloo allreduce", "nccl": "ncclAllReduce"}[
        comm.backend.value
    ]
    note(
        f"calibration · {comm.backend} · {p} ranks on {cores} cores"
        f"{' (oversubscribed)' if p > (cores or p) else ''}"
    )
    note(f"network: {net.describe()}")
    note(f"{pr}")
    note(
        "  probe step times: "
        + ", ".join(f"{s} B: {t * 1e6:.1f} µs" for s, t in zip(pr.sizes, pr.step_s))
    )
    if pr.two_tier:
        note(
            "  between hosts, every rank at once: "
            + ", ".join(f"{sz} B: {t * 1e6:.1f} µs" for sz, t in zip(pr.sizes, pr.inter_step_s))
            + f"; one rank per host, {pr.sizes[-1]} B: {pr.alone_step_s * 1e6:.1f} µs"
        )
    note(
        "  per rank (α µs, GB/s): "
        + ", ".join(f"({a * 1e6:.0f}, {1 / b / 1e9:.2f})" for a, b in pr.per_rank)
    )
    # 80 columns: size 8, algorithm 23 (auto:recursive_doubling), measured and predicted 11, error 8, native 14
    say(
        f"{'size':>8} {'algorithm':<23} {'measured':>11} {'predicted':>11} {'error':>8} "
        f"{native_name:>14}"
    )
    rows = []
    for nbytes in sizes:
        x = timing_buffer(nbytes // 4)
        iters = args.iters or iterations_for(nbytes)
        native = time_calls(
            comm, lambda x=x: comm.transport.native_all_reduce(x, "sum"), iters, args.repeats
        )
        for name in args.algorithms.split(","):
            alg = resolve(name)
            sched = alg.select(p, nbytes, HookComm(comm))
            shown = sched.name
            if isinstance(alg, Torus2D):
                shown = "torus2d({}x{})".format(*alg.shape(p, comm.local_size))
            t = time_calls(
                comm,
                lambda x=x, alg=alg: commrt.all_reduce(x, comm, algorithm=alg, op="sum"),
                iters,
                args.repeats,
            )
            pred = sim.simulate(sched, nbytes=nbytes, network=net).time_s
            err = (pred - t) / t
            rows.append(
                dict(
                    world_size=p,
                    nbytes=nbytes,
                    algorithm=shown,
                    steps=sched.num_steps,
                    measured_s=t,
                    predicted_s=pred,
                    error=err,
                    native_s=native,
                )
            )
            say(
                f"{nbytes >> 10:>7}K {shown:<23} {t * 1e6:9.1f}µs {pred * 1e6:9.1f}µs "
                f"{err * 100:+7.1f}% "
                f"{native * 1e6:12.1f}µs",
                flush=True,
            )
    if comm.rank == 0:
        mean_abs = sum(abs(r["error"]) for r in rows) / len(rows)
        note(f"mean |error| {mean_abs * 100:.1f}% over {len(rows)} points")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"probe": pr.to_dict(), "rows": rows}, f, indent=1)
            note(f"wrote {args.json}")
        if args.probe_file:
            note(f"wrote {pr.save(args.probe_file)}")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
