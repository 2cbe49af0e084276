"""All-reduce: commrt algorithms next to the engine's own all-reduce, same run.

From the repository root, after ``pip install -e '.[dev]'``, on 2 and 4 ranks
(every rank runs pytest; rank 0 reports)::

    mpiexec -n 2 python -m pytest bench/bench_allreduce.py --benchmark-only
    mpiexec -n 4 python -m pytest bench/bench_allreduce.py --benchmark-only
    mpiexec -n 2 python -m pytest bench/bench_allreduce.py --benchmark-only -k "8B or 64KB"  # quick

* ``test_allreduce``: per transport (mpi, gloo) and size, the native
  all-reduce (MPI_Allreduce, gloo's allreduce), then ``auto``, ring,
  halving-doubling, recursive doubling, the 2D torus and the pipelined
  torus (``torus2d_pipelined``: the buffer in segments, each a step behind
  the last). ``auto`` is first called until it has settled on a schedule
  for the size (its learning times its choice and may try the others;
  timing those calls would time the trial, not the choice). Each records
  algbw = bytes / time and busbw = algbw * 2(p-1)/p (nccl-tests
  definitions) in ``extra_info`` and in the summary table, and its time
  over the native all-reduce's (``vs_native``).
* ``test_small_interleaved``: ``auto`` against mpi4py's ``Allreduce`` on a
  numpy buffer at 8 B and 64 KiB, interleaved: 9 rounds, each 3000 calls
  of one and then 3000 of the other (a barrier before each), so both meet
  the same load. ``ratio`` is auto's median per-call time over MPI's,
  beside the goal (:data:`GOALS`: 3x at 8 B on 2 ranks, 1.2x at 64 KiB on
  2 ranks, 1.5x at 64 KiB on 4).

The limit for comparison is memory-copy bandwidth (bench_kernels.py
measures it): on one machine every byte a rank sends is a copy through
shared memory. Outside mpiexec the benchmarks skip, saying how to run them.
"""

import statistics
import time

import pytest

import commrt
from commrt.algorithms.auto import candidates, learning
from commrt.algorithms.auto_learn import calls_to_settle
from commrt.cli.bench import busbw_factor, iterations_for, timing_buffer
from commrt.cli.launch import already_launched

# 8 B and 4 KiB: latency-bound (one small bucket, gossip, control traffic); the rest: bandwidth
SIZES = {
    "8B": 8,
    "4KB": 1 << 12,
    "64KB": 1 << 16,
    "256KB": 1 << 18,
    "1MB": 1 << 20,
    "4MB": 1 << 22,
    "16MB": 1 << 24,
    "64MB": 1 << 26,
}
# native first: the others report their time relative to it
IMPLS = [
    "native", "auto", "ring", "halving_doubling", "recursive_doubling", "torus2d",
    "torus2d_pipelined",
]  # fmt: skip
TRANSPORTS = ["mpi", "gloo"]
#: (ranks, bytes) -> the goal for auto's time over MPI_Allreduce's: the most it may take
GOALS = {(2, 8): 3.0, (2, 1 << 16): 1.2, (4, 1 << 16): 1.5}

pytestmark = pytest.mark.skipif(
    not already_launched(),
    reason="multi-rank benchmark: run under mpiexec -n 2 (or 4) python -m pytest ...",
)


@pytest.fixture(scope="module")
def comms():
    made = {name: commrt.init(name, timeout=120) for name in TRANSPORTS}
    yield made
    for c in made.values():
        c.close()


@pytest.fixture(scope="module")
def native_times():
    """(transport, p, size) -> the native all-reduce's median seconds (filled as they run)."""
    return {}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_allreduce(benchmark, record_bandwidth, comms, native_times, transport, impl, size):
    comm = comms[transport]
    nbytes = SIZES[size]
    x = timing_buffer(nbytes // 4)
    if impl == "native":
        fn = lambda: comm.transport.native_all_reduce(x, "sum")  # noqa: E731
    else:
        fn = lambda: commrt.all_reduce(x, comm, algorithm=impl, op="sum")  # noqa: E731
    if impl == "auto":
        settle_auto(comm, nbytes, fn)
    benchmark.group = f"allreduce {transport} p={comm.world_size} {size}"
    comm.barrier()
    # fixed counts on every rank: timing-based calibration could differ between ranks and deadlock
    benchmark.pedantic(fn, rounds=5, iterations=iterations_for(nbytes) // 3 + 1, warmup_rounds=1)
    t = benchmark.stats.stats.median
    algbw = nbytes / t / 1e9
    busbw = algbw * busbw_factor(comm.world_size)
    benchmark.extra_info.update(
        bytes=nbytes, world_size=comm.world_size, algbw_GBps=algbw, busbw_GBps=busbw
    )
    cols = dict(time_us=t * 1e6, algbw=algbw, busbw=busbw)
    key = (transport, comm.world_size, size)
    if impl == "native":
        native_times[key] = t
    elif key in native_times:
        cols["vs_native"] = t / native_times[key]
        benchmark.extra_info["vs_native"] = cols["vs_native"]
    record_bandwidth(f"allreduce {transport} p={comm.world_size}", impl, size, **cols)


def settle_auto(comm, nbytes: int, fn) -> int:
    """Call ``auto`` (``fn``) until it settles on a schedule for ``nbytes`` (its watch and,
    if that missed, its trial and rematch); the calls made. The ranks agree on what auto
    learns, so they stop at the same call."""
    most = calls_to_settle(len(candidates(comm.world_size)))
    for made in range(1, most + 1):
        fn()
        if learning(comm)[nbytes].phase == "settled":
            return made
    return most


@pytest.mark.parametrize("size", ["8B", "64KB"])
def test_small_interleaved(benchmark, record_bandwidth, comms, size):
    import numpy as np
    from mpi4py import MPI

    comm, nbytes, world = comms["mpi"], SIZES[size], MPI.COMM_WORLD
    # zeros: sums stay zero (no overflow to inf, no denormals) on both sides
    x, y = timing_buffer(nbytes // 4), np.zeros(nbytes // 4, dtype=np.float32)
    calls = 3000  # per round and side

    def ours():
        commrt.all_reduce(x, comm, algorithm="auto", op="sum")

    def native():
        world.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)

    def per_call(fn) -> float:
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    mine, theirs = [], []

    def one_round():
        mine.append(per_call(ours))
        theirs.append(per_call(native))

    settle_auto(comm, nbytes, ours)
    per_call(native)  # warm-up
    benchmark.group = f"auto vs MPI_Allreduce, interleaved, p={comm.world_size} {size}"
    benchmark.pedantic(one_round, rounds=9, iterations=1, warmup_rounds=0)
    goal = GOALS.get((comm.world_size, nbytes))
    cols = dict(
        auto_us=statistics.median(mine) * 1e6,
        mpi_us=statistics.median(theirs) * 1e6,
        ratio=statistics.median(mine) / statistics.median(theirs),
    )
    if goal is not None:
        cols["goal"] = goal
    benchmark.extra_info.update(cols, bytes=nbytes, world_size=comm.world_size)
    record_bandwidth(
        f"auto vs MPI_Allreduce, interleaved rounds, p={comm.world_size}", "auto", size, **cols
    )
