"""The stall verdict's cost on the smallest all-reduce: positions kept, or not, alternated.

Keeping each rank's position (:mod:`commrt.schedule.position`: a few
attribute writes per call and per schedule step) and the stall watch thread
(a heartbeat to the store every second) should leave the 8-byte all-reduce
no slower; this measures how much slower they make it. Under mpiexec, on 2 ranks::

    mpiexec -n 2 python -m pytest bench/bench_stall.py --benchmark-only

* ``test_positions_kept_or_not``: 8 B sum all-reduces (ring) on two MPI
  communicators of the same ranks, in 9 rounds of 3000 calls on one, then
  3000 on the other (a barrier before each), so both meet the same load.
  ``kept``: as shipped (positions written, stall watch on, every second);
  ``bare``: the watch off (``stall_s=0``) and an executor whose ``run`` is
  this module's copy of it without the position writes. ``ratio`` is kept's median per-call time over bare's,
  ``min_ratio`` its fastest round's over bare's fastest. On a loaded
  machine both swing with the scheduler, far more than the writes cost.
* ``test_run_cost_kept_or_not`` (one process, no mpiexec needed): what the
  position writes add to ``Executor.run`` itself, the executor's whole path
  for a call on a one-rank gloo communicator (a schedule of no steps, so
  only the per-call writes), the shipped ``run`` against the bare one,
  alternated, the fastest of many repeats (what load disturbs least).
  ``delta_ns`` is the difference per call.
"""

import statistics
import time

import pytest

import commrt
from commrt.cli.bench import timing_buffer
from commrt.cli.launch import already_launched
from commrt.schedule.executor import Executor, _run_step

multi_rank = pytest.mark.skipif(
    not already_launched(), reason="multi-rank benchmark: run under mpiexec -n 2 python -m pytest"
)


class BareExecutor(Executor):
    """The executor without the position writes: its run on a binding with every position
    write taken out (the CPU, blocking path; a stream-ordered transport takes the shipped
    one)."""

    def _run(self, run, buf, timeout, bucket, tracer, spin_s):
        bound, transport = run.bound, run.transport
        if not bound.member:
            return 0
        if transport.traits.stream_ordered or tracer is not None:
            return super()._run(run, buf, timeout, bucket, tracer, spin_s)
        for step in bound.steps:
            _run_step(step, time.monotonic() + timeout, run.schedule, timeout, bucket, spin_s)
        return bound.sent_bytes


@pytest.fixture(scope="module")
def pair():  # the two communicators of test_positions_kept_or_not
    kept = commrt.init("mpi", timeout=120)
    bare = commrt.init("mpi", timeout=120, stall_s=0)
    bare.executor = BareExecutor()
    assert kept.stall is not None and bare.stall is None
    yield kept, bare
    kept.close()
    bare.close()


@multi_rank
def test_positions_kept_or_not(benchmark, record_bandwidth, pair):
    kept, bare = pair
    x, y = timing_buffer(2), timing_buffer(2)  # 8 bytes each
    calls, times = 3000, {"kept": [], "bare": []}

    def per_call(comm, buf) -> float:
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            commrt.all_reduce(buf, comm, algorithm="ring", op="sum")
        return (time.perf_counter() - t0) / calls

    def one_round():
        times["kept"].append(per_call(kept, x))
        times["bare"].append(per_call(bare, y))

    per_call(kept, x), per_call(bare, y)  # warm-up: first calls agree and bind
    benchmark.group = f"stall verdict's cost, 8 B ring all-reduce, p={kept.world_size}"
    benchmark.pedantic(one_round, rounds=9, iterations=1, warmup_rounds=0)
    cols = {
        "kept_us": statistics.median(times["kept"]) * 1e6,
        "bare_us": statistics.median(times["bare"]) * 1e6,
    }
    cols["ratio"] = cols["kept_us"] / cols["bare_us"]
    # the fastest round of each: what a loaded machine disturbs least
    cols["min_ratio"] = min(times["kept"]) / min(times["bare"])
    benchmark.extra_info.update(cols, rounds_kept_us=[t * 1e6 for t in times["kept"]],
                                rounds_bare_us=[t * 1e6 for t in times["bare"]])  # fmt: skip
    record_bandwidth(benchmark.group, "kept/bare", "8B", **cols)


def test_run_cost_kept_or_not(benchmark, record_bandwidth):
    import timeit

    from commrt.algorithms import Ring

    comm = commrt.init("gloo", rank=0, world_size=1)
    buf, schedule = timing_buffer(2), Ring().schedule(1)
    kept, bare = Executor(), BareExecutor()
    runs = {
        name: (lambda ex=ex: ex.run(schedule, buf, comm.transport, 60.0))
        for name, ex in (("kept", kept), ("bare", bare))
    }
    number, best = 20000, {"kept": [], "bare": []}

    def one_round():
        for name, fn in runs.items():
            best[name].append(timeit.timeit(fn, number=number) / number)

    benchmark.group = "stall verdict's cost, Executor.run per call, one rank"
    benchmark.pedantic(one_round, rounds=30, iterations=1, warmup_rounds=2)
    cols = {"kept_ns": min(best["kept"]) * 1e9, "bare_ns": min(best["bare"]) * 1e9}
    cols["delta_ns"] = cols["kept_ns"] - cols["bare_ns"]
    benchmark.extra_info.update(cols)
    record_bandwidth(benchmark.group, "kept-bare", "8B", **cols)
    comm.close()
