"""The pipelined torus against gloo's own all-reduce on two tiers, with the floor.

Run as every rank of a job whose ranks span hosts, e.g. on 4 namespace hosts
× 2 ranks with 1 Gbit/s links (tests/netns.py; needs root)::

    python tests/netns.py --hosts 4 --ranks-per-host 2 --rate 1gbit -- \\
        python bench/bench_ptorus.py --sizes 16M,64M --rounds 7

For each size it times, interleaved round by round (the order rotates each
round, so a burst of load on this shared machine hits every variant alike):

* ``gloo``: ``torch.distributed.all_reduce`` on a default gloo process group
  of its own (the engine's own collective, the one to beat);
* ``torus2d``: ``commrt.all_reduce(algorithm=Torus2D())``: one row per host;
* ``pipelined``: ``PipelinedTorus2D()``: the same grid, the buffer in
  segments (one per MiB, up to 16), each a step behind the last;
* ``auto``: ``algorithm="auto"`` (its choice is printed), once it has settled: its
  learning first times its choice and may try other candidates, and samples of those
  calls would time the trial, not the choice.

A sample is one call, started after a barrier, timed on every rank; the
sample is the slowest rank's time. The table gives per variant the median,
the fastest and slowest sample, the median of its ratio to gloo's sample of
the same round (paired, so load that hits both cancels), and its ratio to
the floor: each host must send 2(H−1)/H · n bytes over its one link
(``--link-gbit``), the least any all-reduce can send off a host, with one
link per host. ``predicted`` is :func:`commrt.sim.simulate` of the schedule
that ran, on the network the probe measured (the price ``auto`` compares).
Rank 0 prints an 80-column table; ``--json`` also writes every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

# run as a script, this folder is on sys.path: auto settles as in the model-error table
from auto_vs_candidates import settle_auto

import commrt
from commrt import sim
from commrt.algorithms import PipelinedTorus2D, Torus2D, resolve
from commrt.algorithms.auto import choices
from commrt.cli.bench import timing_buffer
from commrt.cli.units import parse_size
from commrt.probe import probe

VARIANTS = ("gloo", "torus2d", "pipelined", "auto")


def floor_s(nbytes: int, hosts: int, link_bytes_per_s: float) -> float:
    """Seconds for each host to send 2(H−1)/H · n bytes over one link of that rate."""
    return 2 * (hosts - 1) / hosts * nbytes / link_bytes_per_s if hosts > 1 else 0.0


def calls(comm, x: torch.Tensor) -> dict:
    """One all-reduce per variant on ``x`` (sum; the contents do not matter for time)."""
    algs = {"torus2d": Torus2D(), "pipelined": PipelinedTorus2D(), "auto": resolve("auto")}
    out = {"gloo": lambda: dist.all_reduce(x)}
    for name, alg in algs.items():
        out[name] = lambda alg=alg: commrt.all_reduce(x, comm, algorithm=alg, op="sum")
    return out


def sample(comm, fn) -> float:
    """One barrier-aligned call; the slowest rank's seconds (all ranks get it)."""
    comm.barrier()
    t0 = time.perf_counter()
    fn()
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def measure(comm, nbytes: int, rounds: int) -> dict[str, list[float]]:
    x = timing_buffer(nbytes // 4)
    fns = calls(comm, x)
    for fn in fns.values():  # warm-up: connections, plans, auto's probe and choice
        fn()
    settle_auto(comm, nbytes, fns["auto"])
    times = {k: [] for k in fns}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for k in order:
            times[k].append(sample(comm, fns[k]))
    return times


def predicted(comm, nbytes: int, net) -> dict[str, float]:
    p = comm.world_size
    scheds = {
        "torus2d": Torus2D().select(p, nbytes, comm),
        "pipelined": PipelinedTorus2D().select(p, nbytes, comm),
        "auto": resolve("auto").select(p, nbytes, comm),
    }
    return {k: sim.simulate(s, nbytes=nbytes, network=net).time_s for k, s in scheds.items()}


def table(nbytes: int, times: dict, floor: float, pred: dict, choice: str) -> list[str]:
    """Rows of at most 80 characters: ms, spread, paired ratio to gloo, ratio to floor."""
    lines = [
        f"{nbytes >> 20} MiB · floor {floor * 1e3:.1f} ms · auto chose {choice}",
        f"{'variant':<10} {'median ms':>9} {'min':>7} {'max':>7} {'×gloo':>6} "
        f"{'(min-max)':>11} {'×floor':>6} {'pred ms':>8}",
    ]
    gloo = times["gloo"]
    for k, v in times.items():
        ratios = [a / b for a, b in zip(v, gloo)]
        p = f"{pred[k] * 1e3:8.1f}" if k in pred else f"{'':>8}"
        lines.append(
            f"{k:<10} {statistics.median(v) * 1e3:9.1f} {min(v) * 1e3:7.1f} {max(v) * 1e3:7.1f} "
            f"{statistics.median(ratios):6.3f} {min(ratios):5.2f}-{max(ratios):<5.2f} "
            f"{statistics.median(v) / floor if floor else float('nan'):6.3f} {p}"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16M,64M")
    ap.add_argument("--rounds", type=int, default=7, help="samples per variant and size")
    ap.add_argument("--link-gbit", type=float, default=1.0, help="each host's link (floor)")
    ap.add_argument("--port-offset", type=int, default=1, help="torch.distributed's port")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    comm = commrt.init("gloo", timeout=600)
    port = int(os.environ.get("MASTER_PORT", 29500)) + args.port_offset
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(
        "gloo", init_method=f"tcp://{addr}:{port}", rank=comm.rank, world_size=comm.world_size
    )
    p, local = comm.world_size, comm.local_size or 1
    hosts = p // local
    net = probe(comm).network()
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# {p} ranks = {hosts} hosts × {local}, {os.cpu_count()} cores, {args.link_gbit} Gbit/s")
    say(f"# probe: {net.describe()}")
    say(f"# load {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    report = []
    for nbytes in (parse_size(s) for s in args.sizes.split(",") if s):
        times = measure(comm, nbytes, args.rounds)
        pred = predicted(comm, nbytes, net)
        choice = choices(comm)[nbytes].label
        floor = floor_s(nbytes, hosts, args.link_gbit * 1e9 / 8)
        for line in table(nbytes, times, floor, pred, choice):
            say(line)
        say(f"# load {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
        report.append(dict(nbytes=nbytes, floor_s=floor, choice=choice, times=times, pred=pred))
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    comm.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
