"""The hot path: what a call costs on top of the bytes it moves (CPU).

From the repository root, after ``pip install -e '.[dev]'``::

    python -m pytest bench/bench_hotpath.py --benchmark-only -k step      # one process
    mpiexec -n 2 python -m pytest bench/bench_hotpath.py --benchmark-only

* ``test_executor_step``: the executor's host time per schedule step, on a
  transport that moves nothing (every send and receive is done when it
  starts), so what is timed is the executor alone: the binding's memo, the
  position writes, starting each step's prepared operations, the waits'
  bookkeeping and the adds of tiny pieces. A ring all-reduce as rank 0 of 8
  (14 steps) on 64 float32 elements; ``us_step`` beside the goal of 5 µs.
* ``test_small_allreduce``: ``commrt.all_reduce`` (``auto``, settled) over
  shared memory and over MPI next to mpi4py's ``MPI_Allreduce`` at 8 B,
  1 KiB and 64 KiB, alternated: 9 rounds, each ``calls`` calls of one side,
  then of the next (a barrier before each; the order rotates from round to
  round), so all sides meet the same load.
  ``shm_x`` and ``mpi_x`` are the medians per call over MPI_Allreduce's,
  beside the goals (8 B: 1.5x over shm, 1.3x over MPI). Each round then
  times a third as many calls of each side one by one: ``shm_x_p50`` and
  ``mpi_x_p50`` are the ratios of the median single calls, which a peer
  descheduled for a time slice (milliseconds, on a loaded machine) moves far
  less than the means. At p = 2 a fourth side, ``floor``, times one
  exchange over mpi4py's persistent requests (``Startall``, ``Waitall``), as
  commrt's MPI transport prepares a step, and a numpy add, without commrt
  (``floor_x``, ``floor_x_p50``): the least any schedule over MPI's
  point-to-point calls costs from Python. A fifth, ``shm_floor``, times
  one exchange through a pair of shared-memory rings from Python
  (``shm_floor_x``): the least any commrt call over shm costs. Needs mpiexec.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from bench_allreduce import settle_auto

import commrt
from commrt.algorithms import resolve
from commrt.cli.bench import timing_buffer
from commrt.cli.launch import already_launched
from commrt.schedule.executor import Executor
from commrt.transports.base import Pending, Transport

#: the goals for (transport, bytes) at p=2: commrt's time per call over MPI_Allreduce's
GOALS = {("shm", 8): 1.5, ("mpi", 8): 1.3}
STEP_GOAL_US = 5.0
SIZES = {"8B": 8, "1KB": 1 << 10, "64KB": 1 << 16}


class _Done(Pending):
    """Operations that finished as they started."""

    def wait_recv(self, i: int, deadline: float) -> bool:
        return True

    def wait_send(self, i: int, deadline: float) -> bool:
        return True


class NullTransport(Transport):
    """A transport that moves nothing: what is left of a step is the executor's own work."""

    name = "null"

    def __init__(self, rank: int, world_size: int):
        super().__init__(rank, world_size, torch.device("cpu"))
        self.done = _Done()

    def exchange(self, sends, recvs, tag) -> Pending:
        return self.done

    def barrier(self, timeout: float) -> bool:
        return True

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        pass


def test_executor_step(benchmark, record_bandwidth):
    p, runs = 8, 2000
    schedule = resolve("ring").schedule(p)
    ex, tr, buf = Executor(), NullTransport(0, p), timing_buffer(64)

    def loop():
        for _ in range(runs):
            ex.run(schedule, buf, tr, 60.0, 4 << 20, None, None, None, buf)

    loop()  # bind and compile once
    benchmark.group = "executor host time per step (transport that moves nothing)"
    benchmark.pedantic(loop, rounds=9, iterations=1, warmup_rounds=1)
    us = benchmark.stats.stats.median / runs / schedule.num_steps * 1e6
    benchmark.extra_info.update(us_step=us, steps=schedule.num_steps, goal_us=STEP_GOAL_US)
    record_bandwidth(benchmark.group, f"ring p={p}", "256B", us_step=us, goal=STEP_GOAL_US)


@pytest.fixture(scope="module")
def comms():
    if not already_launched():
        pytest.skip("multi-rank benchmark: run under mpiexec -n 2 python -m pytest ...")
    made = {name: commrt.init(name, timeout=120) for name in ("shm", "mpi")}
    yield made
    for c in made.values():
        c.close()


class PersistentFloor:
    """The least a schedule step over MPI's point-to-point calls can cost from Python, at
    p = 2, called as a function: start the step's persistent receive and send (mpi4py's
    ``Startall`` on ``Recv_init``/``Send_init`` requests made once, as commrt's MPI
    transport prepares a bound step), wait for both (``Waitall``), add the piece (numpy).
    No commrt: any schedule commrt runs over MPI pays at least this, so ``floor_x``
    bounds what ``mpi_x`` can reach. :meth:`free` frees the requests."""

    def __init__(self, world, nbytes: int):
        import numpy as np
        from mpi4py import MPI

        peer = 1 - world.Get_rank()
        self.x = np.ones(nbytes // 4, dtype=np.float32)
        self.got = np.empty_like(self.x)
        self.reqs = [world.Recv_init(self.got, peer, 7), world.Send_init(self.x, peer, 7)]
        self.startall, self.waitall, self.add = MPI.Prequest.Startall, MPI.Request.Waitall, np.add

    def __call__(self) -> None:
        self.startall(self.reqs)
        self.waitall(self.reqs)
        self.add(self.x, self.got, out=self.got)

    def free(self) -> None:
        for r in self.reqs:
            r.Free()


def shm_python_floor(world, nbytes: int):
    """The least an exchange through shared-memory rings can cost from Python, at p = 2:
    each rank writes a header and its bytes into its peer's ring and stores the tail, spins
    until its own ring's tail moves, copies the bytes out, adds them (numpy) and stores the
    head, under a lock (as a transport that threads share must). No matching, no queue, no
    death check, no commrt: any commrt call over shm pays at least this, so ``shm_floor_x``
    bounds what ``shm_x`` can reach. The rings live in one ``/dev/shm`` file, unlinked once
    both ranks have mapped it."""
    import mmap
    import os
    import threading

    import numpy as np

    rank, size = world.Get_rank(), 1 << 20
    path = world.bcast(f"/dev/shm/commrt-bench-floor-{os.getpid()}" if rank == 0 else None)
    if rank == 0:
        with open(path, "wb") as f:
            f.truncate(2 * (128 + size))
    world.Barrier()
    fd = os.open(path, os.O_RDWR)
    mem = memoryview(mmap.mmap(fd, 2 * (128 + size)))
    os.close(fd)
    world.Barrier()
    if rank == 0:
        os.unlink(path)

    def ring(owner: int):  # (tail, head, bytes, words) of the ring ``owner`` reads
        at = owner * (128 + size)
        data = mem[at + 128 : at + 128 + size]
        return mem[at : at + 8].cast("Q"), mem[at + 64 : at + 72].cast("Q"), data, data.cast("q")

    out_tail, _, out_bytes, out_words = ring(1 - rank)
    in_tail, in_head, in_bytes, in_words = ring(rank)
    x = np.ones(nbytes // 4, dtype=np.float32)
    mine, got = memoryview(x.view(np.uint8)), np.empty(nbytes, np.uint8)
    got_mem, got_elems, lock = memoryview(got), got.view(np.float32), threading.Lock()
    slot = 16 + ((nbytes + 15) & ~15)  # a header and the bytes, padded
    span = size - size % slot  # messages never wrap: each rank has at most two in flight
    pos = [0, 0]  # this rank's tail in its peer's ring, its head in its own

    def step():
        with lock:
            tail = pos[0]
            at = tail % span
            out_words[at >> 3], out_words[(at >> 3) + 1] = 7, nbytes
            out_bytes[at + 16 : at + 16 + nbytes] = mine
            pos[0] = tail = tail + slot
            out_tail[0] = tail
        head = pos[1]
        while in_tail[0] == head:
            pass
        with lock:
            at = head % span
            tag, n = in_words[at >> 3], in_words[(at >> 3) + 1]
            if tag != 7:  # the least matching: the message is the one expected
                raise RuntimeError(f"shm floor: tag {tag} where 7 was expected")
            got_mem[:] = in_bytes[at + 16 : at + 16 + n]
            np.add(x, got_elems, out=got_elems)
            pos[1] = head = head + slot
            in_head[0] = head

    return step


@pytest.mark.parametrize("size", list(SIZES))
def test_small_allreduce(benchmark, record_bandwidth, comms, size):
    import numpy as np
    from mpi4py import MPI

    nbytes, world = SIZES[size], MPI.COMM_WORLD
    calls = 3000 if nbytes <= 1024 else 600  # per round and side
    bufs = {name: timing_buffer(nbytes // 4) for name in comms}
    y = np.zeros(nbytes // 4, dtype=np.float32)
    sides = {
        name: (lambda c=c, x=bufs[name]: commrt.all_reduce(x, c, algorithm="auto", op="sum"))
        for name, c in comms.items()
    }
    sides["MPI_Allreduce"] = lambda: world.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)
    if world.Get_size() == 2:
        sides["floor"] = PersistentFloor(world, nbytes)
        sides["shm_floor"] = shm_python_floor(world, nbytes)
    times: dict[str, list] = {name: [] for name in sides}
    singles: dict[str, list] = {name: [] for name in sides}

    def per_call(fn) -> float:
        comms["mpi"].barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    def each_call(fn, into: list) -> None:
        comms["mpi"].barrier()
        clock = time.perf_counter
        for _ in range(calls // 3):
            t0 = clock()
            fn()
            into.append(clock() - t0)

    order = list(sides)

    def one_round():
        for name in order:
            times[name].append(per_call(sides[name]))
        for name in order:
            each_call(sides[name], singles[name])
        order.append(order.pop(0))  # each side takes each place in a round in turn

    for name, c in comms.items():
        settle_auto(c, nbytes, sides[name])
    one_round()  # warm-up
    for t in (*times.values(), *singles.values()):
        t.clear()
    p = world.Get_size()
    benchmark.group = f"small all-reduce, alternated, p={p} {size}"
    try:
        benchmark.pedantic(one_round, rounds=9, iterations=1, warmup_rounds=0)
    finally:
        if "floor" in sides:
            sides["floor"].free()
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["MPI_Allreduce"]
    cols = dict(mpi_us=base * 1e6, shm_us=med["shm"] * 1e6, shm_x=med["shm"] / base)
    cols.update(over_mpi_us=med["mpi"] * 1e6, mpi_x=med["mpi"] / base)
    one = {name: statistics.median(t) for name, t in singles.items()}
    cols.update(shm_x_p50=one["shm"] / one["MPI_Allreduce"])
    cols.update(mpi_x_p50=one["mpi"] / one["MPI_Allreduce"])
    if "floor" in med:
        cols.update(floor_x=med["floor"] / base, floor_x_p50=one["floor"] / one["MPI_Allreduce"])
        cols.update(shm_floor_x=med["shm_floor"] / base)
    benchmark.extra_info.update(cols, bytes=nbytes, world_size=p)
    for (transport, goal_bytes), goal in GOALS.items():
        if goal_bytes == nbytes and p == 2:
            cols[f"{transport}_goal"] = goal
    record_bandwidth(f"commrt all-reduce vs MPI_Allreduce, p={p}", "auto", size, **cols)
