"""What backup workers' control plane costs one TCPStore, measured on this machine.

Threads stand for ranks (torch's store calls release the GIL), each with its
own connection to one real TCPStore server in this process, as ranks have:

* ``rtt``: one client's round trip for a one-key ``add``, nothing else running;
* ``op``: the server's time per one-key operation, from its throughput when
  16 clients ``add`` to one key at once (the ticket counter's case);
* ``key``: the server's extra time per key of a multi-key read
  (``multi_get`` of 64 keys against 1, under 16 clients);
* ``steps``: the real protocol for p = 4, 8, 16: every rank checks it was
  not declared dead, takes a ticket, writes its name, polls for the first N
  names and reads them (:class:`~commrt.sync.backup.arrival.Arrival`), its
  idle time looking for catch-up requests; then the step's commit as on gloo
  (:class:`~commrt.sync.backup.recovery.Reduction`'s ``begin`` and
  ``commit``, with no group to reduce on: the participants count themselves,
  every rank waits for the outcome) and an on-time rank's look for requests
  after its update, while every rank's heartbeat thread
  (:class:`~commrt.sync.backup.liveness.Liveness`) runs. Steps follow each
  other with no compute or reduction: the time per step is the control
  plane's own latency under load; the operations are counted, the commit's
  apart.

``commrt.sim.control`` turns ``rtt``, ``op`` and ``key`` into the cost per
step for p up to 4096 (``commrt simulate`` prints it). From the repository
root, after ``pip install -e '.[dev]'``::

    python bench/bench_control_plane.py            # the table (about a minute)
    python bench/bench_control_plane.py --steps-only 100   # the protocol alone
    pytest bench/bench_control_plane.py --benchmark-only
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from types import SimpleNamespace

from commrt.algorithms import BackupWorkers
from commrt.runtime.store import ControlStore, Host, host_store
from commrt.sim.control import StoreCost, control_cost
from commrt.sync.backup.arrival import Arrival, Role
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.liveness import Liveness
from commrt.sync.backup.recovery import Reduction

CLIENTS = 16
OPS = 400  # per client, per measurement
STEPS = 300
REPEATS = 5  # each per-operation figure is the median of this many runs
HB_WINDOW_S = 2.0  # heartbeats counted over this window


class Counting:
    """A store client that counts operations and keys (one count list per client; the
    caller points ``tally`` at another list to count a phase apart)."""

    def __init__(self, inner, tally: list):
        self.inner, self.tally = inner, tally

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def counted(*args):
            keys = args[0] if name in ("check", "multi_get") else [args[0]]
            self.tally.append(len(keys))
            return fn(*args)

        return counted


def open_store() -> tuple[object, ControlStore]:
    server = host_store()
    return server, ControlStore("127.0.0.1", server.port, Host.LAUNCHER, 60.0)


def together(n: int, body) -> float:
    """Run ``body(i)`` on ``n`` threads started together; the wall seconds they took."""
    go = threading.Barrier(n + 1)

    def run(i):
        go.wait()
        body(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    go.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def measure_ops(cs: ControlStore, repeats: int = REPEATS) -> dict:
    """rtt, op and key (seconds) as described in the module docstring: the median of
    ``repeats`` measurements each (the machine is shared; one run can be far off)."""
    runs = [measure_ops_once(cs) for _ in range(repeats)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def measure_ops_once(cs: ControlStore) -> dict:
    one = cs.client("ops")
    one.add("k", 0)
    start = time.perf_counter()
    for _ in range(OPS):
        one.add("k", 0)
    rtt = (time.perf_counter() - start) / OPS
    clients = [cs.client("ops") for _ in range(CLIENTS)]
    for i in range(64):
        one.set(f"n/{i}", str(i))

    def adds(i):
        for _ in range(OPS):
            clients[i].add("t", 1)

    op = together(CLIENTS, adds) / (CLIENTS * OPS)
    keys = [f"n/{i}" for i in range(64)]

    def gets(width):
        def body(i):
            for _ in range(OPS // 4):
                clients[i].multi_get(keys[:width])

        return together(CLIENTS, body) / (CLIENTS * (OPS // 4))

    key = (gets(64) - gets(1)) / 63  # may come out below 0 on a noisy run: the median decides

    return {"rtt_s": rtt, "op_s": op, "key_s": key}


class NoGroup:
    """Stands for the group made at setup: the bench prices the store, not a reduction."""

    failed = False

    def schedules(self, inner: list, participants) -> list:
        return []


def committing(cs, space: str, arrival: Arrival, liveness: Liveness) -> Reduction:
    """The real commit of :mod:`commrt.sync.backup.recovery`, as on gloo, with no buckets."""
    ctx = SimpleNamespace(comm=SimpleNamespace(transport=SimpleNamespace(name="gloo")))
    red = Reduction(ctx, cs, space, arrival, liveness, [], 60.0)
    red.setup_wire = NoGroup()
    return red


def measure_steps(cs: ControlStore, p: int, backups: int = 1, steps: int = STEPS) -> dict:
    """The real arrival and commit protocol and heartbeats on ``p`` threads: seconds and
    store operations (and keys) per global step, the commit's operations apart."""
    alg = BackupWorkers(backups)
    n, space = alg.participants(p), f"steps{p}"
    tallies, commits = [[] for _ in range(p)], [[] for _ in range(p)]
    stores = [Counting(cs.client(space), tallies[r]) for r in range(p)]
    live = [Liveness(cs, space, stores[r], r, p, alg.dead_after_s, 60.0) for r in range(p)]
    arrive = [Arrival(stores[r], cs, space, r, p, n, alg, 60.0) for r in range(p)]
    reductions = [committing(cs, space, arrive[r], live[r]) for r in range(p)]
    for lv in live:
        lv.start()

    def rank(r):
        store = stores[r]

        def look():  # BackupPolicy's idle work: catch-up requests (none come here)
            store.add(Keys.REQUESTS, 0)

        for g in range(steps):
            store.tally = tallies[r]
            live[r].check_alive()
            role, ranks, names = arrive[r].arrive(g, look)
            store.tally = commits[r]
            on_time = role is Role.ON_TIME
            reductions[r].begin(g, ranks, on_time, names)
            if reductions[r].commit(on_time, look, lambda taking_part: None):
                look()  # after its update an on-time rank serves (BackupPolicy.apply)

    wall = together(p, rank)
    # the heartbeats' own rate, over a window of several beats (steps may be over sooner)
    probe = cs.client(space)
    t0, b0 = time.perf_counter(), sum(int(probe.add(Keys.heartbeat(r), 0)) for r in range(p))
    time.sleep(HB_WINDOW_S)
    t1, b1 = time.perf_counter(), sum(int(probe.add(Keys.heartbeat(r), 0)) for r in range(p))
    for lv in live:
        lv.stop()
    commit_ops = sum(len(t) for t in commits)
    return {
        "p": p,
        "step_s": wall / steps,
        "ops_per_step": (sum(len(t) for t in tallies) + commit_ops) / steps,
        "commit_ops_per_step": commit_ops / steps,
        "keys_per_step": sum(map(sum, tallies + commits)) / steps,
        # each beat is three operations (beat, death counter, one neighbour)
        "heartbeat_ops_per_s": 3 * (b1 - b0) / (t1 - t0),
    }


def main(argv=None, out=print) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps-only",
        type=int,
        metavar="STEPS",
        help="run only the protocol, STEPS global steps per p, priced with the store "
        "costs commrt.sim.control keeps (StoreCost.measured)",
    )
    args = parser.parse_args(argv)
    server, cs = open_store()
    if args.steps_only is None:
        ops = measure_ops(cs)
        out(f"# one TCPStore, threads as ranks, this machine (medians of {REPEATS} runs)")
        out(
            f"rtt {ops['rtt_s'] * 1e6:.1f} us   server per op {ops['op_s'] * 1e6:.1f} us   "
            f"per extra key {ops['key_s'] * 1e6:.2f} us"
        )
        out(
            f"# --store-cost {ops['rtt_s'] * 1e6:.1f},{ops['op_s'] * 1e6:.1f},"
            f"{ops['key_s'] * 1e6:.2f}"
        )
        cost = StoreCost(ops["rtt_s"], ops["op_s"], max(0.0, ops["key_s"]))
    else:
        cost = StoreCost.measured()
        ops = {"rtt_s": cost.rtt_s, "op_s": cost.op_s, "key_s": cost.key_s}
        out(f"# store costs: {cost.describe()} ({cost.source})")
    out("# measured: the real protocol (arrival + commit), steps back to back;")
    out("# model: commrt.sim.control (2 polls per wait)")
    out(
        f"{'p':>4} {'ms/step':>8} {'model':>6} {'ops/step':>8} {'model':>6} {'commit':>6} "
        f"{'model':>6} {'keys/step':>9} {'hb ops/s':>8} {'3p/0.25s':>8}"
    )
    rows = []
    for p in (4, 8, 16):
        r = measure_steps(cs, p, steps=args.steps_only or STEPS)
        m = control_cost(p, 1, cost)
        rows.append(
            dict(
                r,
                model_step_s=m.flat_s,
                model_ops_per_step=m.flat_ops,
                model_commit_ops_per_step=m.flat_commit_ops,
            )
        )
        out(
            f"{p:>4} {r['step_s'] * 1e3:>8.2f} {m.flat_s * 1e3:>6.2f} {r['ops_per_step']:>8.0f} "
            f"{m.flat_ops:>6.0f} {r['commit_ops_per_step']:>6.0f} {m.flat_commit_ops:>6.0f} "
            f"{r['keys_per_step']:>9.0f} {r['heartbeat_ops_per_s']:>8.0f} {3 * p / 0.25:>8.0f}"
        )
    del server
    return {"ops": ops, "steps": rows}


def test_store_round_trip(benchmark, record_bandwidth):
    server, cs = open_store()
    c = cs.client("bench")
    benchmark(c.add, "k", 0)
    del server
    rtt = benchmark.stats.stats.median
    record_bandwidth("one TCPStore, threads as ranks", "one-key add", "rtt", us=rtt * 1e6)


def test_arrival_of_eight_ranks(benchmark, record_bandwidth):
    server, cs = open_store()
    result = benchmark.pedantic(lambda: measure_steps(cs, 8, steps=10), rounds=3, iterations=1)
    record_bandwidth(
        "one TCPStore, threads as ranks",
        "arrival + commit",
        "p=8",
        ms_per_step=result["step_s"] * 1e3,
        ops_per_step=result["ops_per_step"],
        commit_ops=result["commit_ops_per_step"],
    )
    assert result["ops_per_step"] >= 8 * 4  # ticket, name, poll, read: at least four each
    # the commit: each of 7 participants counts itself, checks and reads the outcome; one
    # proposes it; the late rank checks and reads it
    assert result["commit_ops_per_step"] >= 7 * 3 + 1 + 2
    del server


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
