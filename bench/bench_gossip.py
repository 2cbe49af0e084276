"""Gossip (GossipGraD's one-peer exchange) next to the ring all-reduce, per training step.

From the repository root, after ``pip install -e '.[dev]'``, on 2, 4 and 8 ranks
over MPI (every rank runs pytest; rank 0 reports)::

    mpiexec -n 2 python -m pytest bench/bench_gossip.py --benchmark-only    # and -n 4, -n 8

Each benchmark is one step's communication of one gradient bucket: for the
ring, an all-reduce (2(p−1) messages of n/p, 2(p−1)/p·n bytes per rank);
for gossip, that step's exchange with its one peer (the schedule of step t,
t counting up, so rotation and its new schedules are included: one message
of n bytes per rank). Messages and bytes are counted at the transport
(:class:`commrt.transports.counting.CountingTransport`) over the timed
calls. The summary table shows per rank and step: time (µs), messages,
bytes, and algbw = n / time. Outside mpiexec the benchmarks skip.
"""

import itertools

import pytest

import commrt
from commrt.algorithms import Gossip
from commrt.cli.bench import timing_buffer
from commrt.cli.launch import already_launched
from commrt.transports.counting import CountingTransport

SIZES = {"64KB": 1 << 16, "1MB": 1 << 20, "4MB": 1 << 22}
IMPLS = ["ring", "gossip"]
ROUNDS, ITERS = 5, 20

pytestmark = pytest.mark.skipif(
    not already_launched(),
    reason="multi-rank benchmark: run under mpiexec -n 2 (4, 8) python -m pytest ...",
)


@pytest.fixture(scope="module")
def comm():
    c = commrt.init("mpi", timeout=120)
    c.transport = CountingTransport(c.transport)
    yield c
    c.close()


def gossip_step(comm, x, gossip=Gossip()):  # noqa: B008 (a frozen dataclass)
    """One gossip exchange per call, step numbers counting up (the same on every rank)."""
    steps = itertools.count()

    def run():
        schedule = gossip.schedule(comm.world_size, step=next(steps))
        with comm.lock:
            comm.executor.run(
                schedule, x, comm.transport, timeout=comm.timeout, piece_bytes=comm.piece_bytes
            )

    return run


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("impl", IMPLS)
def test_step(benchmark, record_bandwidth, comm, impl, size):
    nbytes = SIZES[size]
    x = timing_buffer(nbytes // 4)
    if impl == "ring":
        fn = lambda: commrt.all_reduce(x, comm, algorithm="ring", op="sum")  # noqa: E731
    else:
        fn = gossip_step(comm, x)
    benchmark.group = f"gossip vs ring, mpi p={comm.world_size} {size}"
    comm.barrier()
    counter = comm.transport
    counter.reset()
    calls = itertools.count()

    def counted():
        next(calls)
        fn()

    # fixed counts on every rank: timing-based calibration could differ between ranks and deadlock
    benchmark.pedantic(counted, rounds=ROUNDS, iterations=ITERS, warmup_rounds=1)
    calls = next(calls)
    t = benchmark.stats.stats.median
    msgs, sent = counter.messages / calls, counter.bytes / calls
    benchmark.extra_info.update(
        bytes=nbytes,
        world_size=comm.world_size,
        messages_per_rank=msgs,
        bytes_per_rank=sent,
        algbw_GBps=nbytes / t / 1e9,
    )
    record_bandwidth(
        f"per rank and step, mpi p={comm.world_size}",
        impl,
        size,
        time_us=t * 1e6,
        messages=msgs,
        sent_KB=sent / 1024,
        algbw=nbytes / t / 1e9,
    )
