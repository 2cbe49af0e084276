"""All-reduce: commrt algorithms next to the engine's own all-reduce, same run.

Run on 2 and 4 ranks (every rank runs pytest; rank 0 reports)::

    mpiexec -n 2 python -m pytest bench/bench_allreduce.py --benchmark-only
    mpiexec -n 4 python -m pytest bench/bench_allreduce.py --benchmark-only

Each benchmark records algbw = bytes / time and busbw = algbw * 2(p-1)/p
(nccl-tests definitions) in ``extra_info`` and in the summary table, and
for small sizes the time against the native all-reduce's (``vs_native``:
auto's speed goal is <= 3x at 8 B, <= 1.2x at 64 KiB on 2 ranks). The
limit for comparison is memory-copy bandwidth (bench_kernels.py measures
it): on one machine every byte a rank sends is a copy through shared memory.
Outside mpiexec the benchmarks skip, saying how to run them.
"""

import pytest

import commrt
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
IMPLS = ["native", "auto", "ring", "halving_doubling", "recursive_doubling", "torus2d"]
TRANSPORTS = ["mpi", "gloo"]

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
