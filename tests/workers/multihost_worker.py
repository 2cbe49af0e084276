"""Run as a rank on namespace hosts (tools/netns.py): commrt across hosts over gloo.

argv[1]: a directory; every rank writes ``rank<r>.json`` there. argv[2]:
comma-separated buffer sizes in bytes at which to time every ``auto``
candidate against ``auto``'s choice ("" = none).

What each rank reports:

* its launch as commrt saw it (rank, local rank and size) and the default
  ``Torus2D()`` grid;
* ``commrt.all_reduce`` (ring, halving_doubling, torus2d, auto) against a
  float64 reference every rank computes from every rank's seeded inputs;
* the bytes it sent to each peer during one ring and one torus2d
  all-reduce (a counting wrapper around the transport), split into peers
  on its own host and on other hosts, the host of each rank coming from
  the harness (GROUP_RANK), not from the rank numbering;
* GradientSync against DDP (fp32, 10 steps) with ring, the default
  torus and auto, and a digest of the final parameters (equal on every rank);
* with timing sizes: ``auto``'s and every candidate's measured time (the
  slowest rank's, median of interleaved runs, once auto has settled), each
  over the fastest candidate paired by round, and auto's choice with its
  predictions.
"""

import collections
import hashlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ddp_reference import rel_err, train_commrt, train_ddp  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import Torus2D  # noqa: E402
from commrt.algorithms.auto import Auto, candidates, choices, label, learning  # noqa: E402
from commrt.algorithms.auto_learn import calls_to_settle  # noqa: E402
from commrt.collectives.core import gather_rows  # noqa: E402
from commrt.transports.counting import CountingTransport  # noqa: E402
from commrt.tuning.hook_comm import HookComm  # noqa: E402
from commrt.tuning.probe import probe  # noqa: E402
from commrt.tuning.topology import ranks_per_node  # noqa: E402

ALGORITHMS = ("ring", "halving_doubling", "torus2d", "auto")
SIZES = (1, 1000, 100_003)
GRADSYNC_STEPS = 10


def inputs(rank, n):
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + 7 * rank + n))


def check_all_reduce(comm):
    failures = []
    for alg in ALGORITHMS:
        for n in SIZES:
            everyone = torch.stack([inputs(r, n) for r in range(comm.world_size)]).double()
            ref, mag = everyone.sum(0), everyone.abs().sum(0)
            t = inputs(comm.rank, n)
            commrt.all_reduce(t, comm, algorithm=alg, op="sum")
            excess = ((t.double() - ref).abs() - 1e-6 * mag).max().item()
            if excess > 0:
                failures.append({"algorithm": alg, "n": n, "excess": excess})
    return failures


def bytes_by_host(comm, counter, hosts):
    me = hosts[comm.rank]
    off = sum(b for peer, b in counter.items() if hosts[peer] != me)
    return {"off_host": off, "on_host": sum(counter.values()) - off}


def count_bytes(comm, hosts, numel):
    out = {}
    for alg in ("ring", "torus2d"):
        # the first call of a signature also agrees it across ranks: count a repeat only
        commrt.all_reduce(torch.ones(numel), comm, algorithm=alg, op="sum")
        before = collections.Counter(comm.transport.bytes_by_peer)
        commrt.all_reduce(torch.ones(numel), comm, algorithm=alg, op="sum")
        out[alg] = bytes_by_host(comm, comm.transport.bytes_by_peer - before, hosts)
    return out


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def gradsync_vs_ddp(comm):
    port = int(os.environ["MASTER_PORT"]) + 1  # commrt's own store holds MASTER_PORT
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
        rank=comm.rank,
        world_size=comm.world_size,
    )
    try:
        ddp = train_ddp(comm.rank, False, steps=GRADSYNC_STEPS)
    finally:
        dist.destroy_process_group()
    out = {}
    for alg in ("ring", "torus2d", "auto"):
        model, nbuckets = train_commrt(comm, comm.rank, False, steps=GRADSYNC_STEPS, algorithm=alg)
        out[alg] = {"rel_err": rel_err(model, ddp), "buckets": nbuckets, "digest": digest(model)}
    return out


def time_candidates(comm, nbytes, repeats, iters=1):
    """``auto`` as it runs (settled: it learns from its own calls) and every candidate: each
    one's time per call (slowest rank, median of ``repeats`` interleaved runs of ``iters``
    calls), each over the fastest candidate paired by round, the model's choice, the
    choice auto settled on and its predictions."""
    algs = candidates(comm.world_size)
    x = torch.ones(nbytes // 4)
    auto = Auto()
    for _ in range(calls_to_settle(len(algs))):  # its watch, and a trial if it missed
        commrt.all_reduce(x, comm, algorithm=auto, op="sum")
        if learning(comm)[nbytes].phase == "settled":
            break
    runs = {label(a): a for a in algs}
    runs["auto"] = auto
    for a in runs.values():  # warm-up: plans, scratch, connections
        commrt.all_reduce(x, comm, algorithm=a, op="sum")
    mine = {n: [] for n in runs}
    for _ in range(repeats):
        for n, a in runs.items():
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                commrt.all_reduce(x, comm, algorithm=a, op="sum")
            mine[n].append((time.perf_counter() - t0) / iters)
    rows = gather_rows(comm, [t for ts in mine.values() for t in ts])
    slowest = [max(r[k] for r in rows) for k in range(len(runs) * repeats)]
    times = {n: slowest[i * repeats : (i + 1) * repeats] for i, n in enumerate(runs)}
    measured = {n: statistics.median(t) for n, t in times.items()}
    fastest = min((n for n in measured if n != "auto"), key=measured.get)
    # each over the fastest, paired by round: a round's runs met the same load on this
    # shared machine (unpaired medians of one schedule differed by 34% here)
    over = {
        n: statistics.median(a / b for a, b in zip(t, times[fastest])) for n, t in times.items()
    }
    choice, tuning = choices(comm)[nbytes], learning(comm)[nbytes]
    return {
        "measured": measured,
        "over_fastest": over,
        "model_choice": tuning.choice,
        "choice": choice.label,
        "learned": choice.learned,
        "tuning": str(tuning),
        "predicted": dict(choice.candidates),  # the model's table, learned or not
    }


def main(out_dir, timing_sizes):
    comm = commrt.init(timeout=120)
    comm.transport = CountingTransport(comm.transport)
    host = int(os.environ["GROUP_RANK"])
    hosts = [int(r[0]) for r in gather_rows(comm, [host])]
    p = comm.world_size
    report = {
        "rank": comm.rank,
        "world_size": p,
        "backend": comm.backend.value,
        "host": host,
        "hosts": hosts,
        "local_rank": comm.local_rank,
        "local_size": comm.local_size,
        "ranks_per_node": ranks_per_node(comm),
        "torus_shape": list(Torus2D().shape(p, comm.local_size)),
        "torus_schedule": Torus2D().select(p, 4096, HookComm(comm)).num_steps,
    }
    report["failures"] = check_all_reduce(comm)
    report["numel"] = numel = p * 1024
    report["bytes"] = count_bytes(comm, hosts, numel)
    report["gradsync"] = gradsync_vs_ddp(comm)
    pr = probe(comm)
    report["probe"] = pr.to_dict()
    report["network"] = pr.network().describe()
    report["overhead"] = repr(pr.network().overhead)  # what auto prices with
    # small buffers: many short calls, each run long enough that a rank woken late by the
    # barrier on this oversubscribed machine does not decide the time
    report["timing"] = {
        str(n): time_candidates(comm, n, *((7, 5) if n <= 1 << 20 else (3, 1)))
        for n in timing_sizes
    }
    comm.close()
    with open(os.path.join(out_dir, f"rank{report['rank']}.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",") if s] if len(sys.argv) > 2 else [])
