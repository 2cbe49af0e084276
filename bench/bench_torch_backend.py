"""DDP and FSDP2 over the "commrt" torch.distributed backend vs over gloo.

From the repository root, after ``pip install -e '.[dev]'``::

    mpiexec -n 2 python -m pytest bench/bench_torch_backend.py --benchmark-only
    mpiexec -n 4 python -m pytest bench/bench_torch_backend.py --benchmark-only
    torchrun --nproc-per-node 2 -m pytest bench/bench_torch_backend.py --benchmark-only

The default group is commrt's (its CPU traffic goes through shared memory on
one host, as auto takes it: commrt.runtime.choice; COMMRT_ALGORITHM picks the
all-reduce, default auto); the reference is a gloo group of the same ranks,
in the same processes.

* ``test_ddp_step``: one DDP training step (forward, backward with the
  bucketed all-reduces, SGD) of the ~25M-parameter MLP of
  bench_gradsync.py (100 MB of fp32 gradients). Goal: commrt ≤ 0.8× gloo at
  2 ranks.
  On a shared machine the two variants, run one after the other, measure
  the load as much as the backend: ``test_ddp_step_alternated`` alternates
  them.
* ``test_ddp_step_alternated``: the same step under four variants that
  take turns step by step in the same processes (an order that flips
  every round, a gloo barrier before each step), so that the load falls on
  all alike: ``local`` (the model alone, no DDP: the compute floor),
  ``ddp_nocomm`` (DDP whose communication hook hands each bucket back
  untouched: DDP's bucket copies and reducer, the floor for any backend),
  ``commrt`` and ``gloo``. Per variant: median wall and process CPU time
  (every thread) per step, and wall time over gloo's. On 2 shared cores a
  step's wall time follows its CPU time. ``communication``: commrt's step
  minus DDP without communication, over gloo's (goal ≤ 0.4 at 2 ranks).
  It measures the steady state: before the alternated rounds the commrt
  variant steps on its own until ``auto`` has settled every bucket size
  (:func:`settle`; while it learns, ``auto`` times runners-up such as
  recursive doubling, which sends the whole bucket at 2 ranks), at most
  ``SETTLE_STEPS`` steps. ``COMMRT_ALGORITHM=ring`` measures without
  learning at all.
* ``test_small_mlp_alternated``: 300 DDP steps of a 32-64-10 MLP (one
  11 kB bucket a step: latency-bound) a turn, commrt and gloo alternated
  turn by turn. Goal: commrt ≤ 1.0× gloo at 2 ranks.
* ``test_all_reduce_alternated``: one 25 MB ``dist.all_reduce`` (DDP's
  bucket size) on the commrt group and on the gloo group, alternated call
  by call the same way, with wall and CPU time: what commrt can save
  inside a DDP step, where a lone call's wall time does not say it.
* ``test_all_reduce_floor``: the floor under those figures, MPI only (under
  mpiexec): one 25 MB and one 100 MB all-reduce by mpi4py's ``Allreduce``,
  by gloo, and by ``commrt.all_reduce`` with ring, recursive doubling and
  halving-doubling forced, alternated call by call, wall and CPU time.
* ``test_fsdp_step``: the same MLP under FSDP2 (``fully_shard`` per layer):
  all-gathers in forward and backward, reduce-scatters in backward.
"""

import os
import statistics

import pytest
import torch
import torch.distributed as dist
from bench_gradsync import IN, OUT, Alternated, _mlp, _no_communication
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import commrt  # registers the backend
import commrt.distributed
from commrt.cli.launch import already_launched, free_port

pytestmark = pytest.mark.skipif(
    not already_launched(),
    reason="multi-rank benchmark: run under mpiexec -n 2 python -m pytest ...",
)

ROUNDS, ITERS = 5, 2
ALTERNATED_ROUNDS = 40
#: at most this many warm-up steps for ``auto`` to settle (:func:`settle`)
SETTLE_STEPS = 48
#: steps in a row in which every all-reduce size ran one schedule: settled
SETTLED_RUN = 6


def init_commrt():
    """The default group over commrt, on the ranks mpiexec or torchrun started; returns a
    gloo group of the same ranks, the reference."""
    import os

    if "MASTER_ADDR" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("commrt")  # torchrun's env:// rendezvous
        return dist.new_group(backend="gloo")
    return init_commrt_over_mpi()


def init_commrt_over_mpi():
    """The default group over commrt, on the ranks mpiexec started (tcp:// rendezvous, a
    port rank 0 picks); returns a gloo group of the same ranks, the reference."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    port = world.bcast(free_port() if world.Get_rank() == 0 else None)
    dist.init_process_group(
        "commrt",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=world.Get_rank(),
        world_size=world.Get_size(),
    )
    return dist.new_group(backend="gloo")


@pytest.fixture(scope="module")
def groups():
    yield {"commrt": None, "gloo": init_commrt()}
    dist.destroy_process_group()


def _schedules_ran() -> dict:
    """Per all-reduce (op, size, dtype) of the default commrt group: calls per schedule."""
    return {k: dict(e.ran) for k, e in commrt.distributed.stats().entries.items()
            if e.op.startswith("allreduce")}  # fmt: skip


def settle(step, reference) -> int:
    """Run ``step`` (a DDP step on the default commrt group) until ``auto`` has settled:
    two blocks of ``SETTLED_RUN`` steps in a row in which each all-reduce size ran one
    schedule, the same in both (a trial may run one candidate for a whole block), at most
    ``SETTLE_STEPS`` steps. Every rank agrees through ``reference`` (a gloo group) when
    to stop. Returns the steps run."""
    done, last = 0, None
    while done < SETTLE_STEPS:
        before = _schedules_ran()
        for _ in range(SETTLED_RUN):
            step()
        done += SETTLED_RUN
        block = {
            key: {name for name, n in ran.items() if n != before.get(key, {}).get(name, 0)}
            for key, ran in _schedules_ran().items()
        }
        steady = last is not None and all(len(ran) <= 1 for ran in block.values())
        steady = steady and all(ran <= last.get(key, ran) for key, ran in block.items())
        last = block
        flag = torch.tensor([int(not steady)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=reference)
        if not flag.item():
            break
    return done


def _batch():
    torch.manual_seed(1)
    return torch.randn(64, IN), torch.randint(0, OUT, (64,))


def _run(benchmark, record_bandwidth, step, what, impl):
    p = dist.get_world_size()
    benchmark.group = f"{what}, MLP 25M params, {p} ranks"
    benchmark.pedantic(step, rounds=ROUNDS, iterations=ITERS, warmup_rounds=1)
    info = {"step_ms": benchmark.stats.stats.median * 1e3}
    benchmark.extra_info.update(info)
    record_bandwidth(f"{what} (MLP 25M, {p} ranks)", impl, "100MB", **info)


@pytest.mark.parametrize("impl", ["commrt", "gloo"])
def test_ddp_step(benchmark, record_bandwidth, groups, impl):
    model = _mlp()
    net = DDP(model, process_group=groups[impl])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = _batch()
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        loss_fn(net(x), y).backward()
        opt.step()
        opt.zero_grad()

    _run(benchmark, record_bandwidth, step, "DDP step", impl)


def test_ddp_step_alternated(benchmark, record_bandwidth, groups):
    x, y = _batch()
    loss_fn = torch.nn.CrossEntropyLoss()

    def stepper(variant):
        model = _mlp()
        group = groups["gloo"] if variant == "gloo" else None
        net = model if variant == "local" else DDP(model, process_group=group)
        if variant == "ddp_nocomm":
            net.register_comm_hook(None, _no_communication)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            loss_fn(net(x), y).backward()
            opt.step()
            opt.zero_grad()

        return step

    variants = ("local", "ddp_nocomm", "commrt", "gloo")
    steps = {v: stepper(v) for v in variants}
    benchmark.extra_info["settle_steps"] = settle(steps["commrt"], groups["gloo"])
    turns = Alternated(steps, lambda: dist.barrier(groups["gloo"]))
    p = dist.get_world_size()
    benchmark.group = f"DDP step, alternated, MLP 25M params, {p} ranks"
    turns.run(benchmark, ALTERNATED_ROUNDS)
    benchmark.extra_info["schedules_ran"] = {str(k): v for k, v in _schedules_ran().items()}
    group = f"DDP step, alternated step by step (MLP 25M, {p} ranks)"
    turns.record(benchmark, record_bandwidth, group, "100MB", ref="gloo")
    # what each backend's communication costs: its step beyond DDP without communication
    wall = {v: statistics.median(turns.wall[v]) for v in variants}
    floor = wall["ddp_nocomm"]
    comm = {v: (wall[v] - floor) * 1e3 for v in ("commrt", "gloo")}
    ratio = comm["commrt"] / comm["gloo"] if comm["gloo"] > 0 else float("nan")
    benchmark.extra_info["communication_vs_gloo"] = ratio
    record_bandwidth(group, "communication", "100MB", commrt_ms=comm["commrt"],
                     gloo_ms=comm["gloo"], commrt_vs_gloo=ratio)  # fmt: skip


def _small_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


SMALL_STEPS = 300


def test_small_mlp_alternated(benchmark, record_bandwidth, groups):
    x = torch.randn(16, 32)

    def turn(variant):
        model = _small_mlp()
        net = DDP(model, process_group=groups[variant])
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def steps():
            for _ in range(SMALL_STEPS):
                net(x).sum().backward()
                opt.step()
                opt.zero_grad()

        return steps

    turns = Alternated({v: turn(v) for v in groups}, lambda: dist.barrier(groups["gloo"]))
    p = dist.get_world_size()
    benchmark.group = f"DDP, {SMALL_STEPS} steps of a 32-64-10 MLP, alternated, {p} ranks"
    turns.run(benchmark, ALTERNATED_ROUNDS)
    group = f"DDP, {SMALL_STEPS} steps of a 32-64-10 MLP a turn, alternated ({p} ranks)"
    turns.record(benchmark, record_bandwidth, group, "11kB", ref="gloo", what="turn")


def test_all_reduce_alternated(benchmark, record_bandwidth, groups):
    t = torch.zeros(25 * 2**20 // 4)  # zeros: a sum repeated in place stays finite
    calls = {k: (lambda g=g: dist.all_reduce(t, group=g)) for k, g in groups.items()}
    turns = Alternated(calls, lambda: dist.barrier(groups["gloo"]))
    p = dist.get_world_size()
    benchmark.group = f"all_reduce 25 MB, alternated, {p} ranks"
    turns.run(benchmark, 3 * ALTERNATED_ROUNDS)
    group = f"one 25 MB all_reduce, alternated call by call ({p} ranks)"
    turns.record(benchmark, record_bandwidth, group, "25MB", ref="gloo", what="call")


FLOOR_IMPLS = ("mpi_allreduce", "gloo", "ring", "recursive_doubling", "halving_doubling")
#: commrt's algorithms through shared memory in the floor (names as they print)
FLOOR_SHM = ("shm:ring", "shm:halving_doubling")


@pytest.mark.parametrize("mb", [25, 100])
def test_all_reduce_floor(benchmark, record_bandwidth, groups, mb):
    """What a large all-reduce costs at the least on these ranks: mpi4py's ``Allreduce``
    (numpy), gloo's ``dist.all_reduce`` and ``commrt.all_reduce`` with each algorithm forced,
    over MPI and (``shm:``) through shared memory, on one buffer, alternated call by call,
    at one DDP bucket (25 MB) and at the MLP's 100 MB of gradients in one call."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        pytest.skip("the floor compares MPI_Allreduce: run under mpiexec")
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() != dist.get_world_size():
        pytest.skip("the floor compares MPI_Allreduce: run under mpiexec")
    t = torch.zeros(mb * 2**20 // 4)  # zeros: a sum repeated in place stays finite
    comm = commrt.init(backend="mpi")
    shm = commrt.init(backend="shm")
    world, a = MPI.COMM_WORLD, t.numpy()

    def forced(alg, over=comm):
        return lambda: commrt.all_reduce(t, over, algorithm=alg, op="sum")

    calls = {
        "mpi_allreduce": lambda: world.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM),
        "gloo": lambda: dist.all_reduce(t, group=groups["gloo"]),
        **{alg: forced(alg) for alg in FLOOR_IMPLS[2:]},
        **{name: forced(name[4:], shm) for name in FLOOR_SHM},
    }
    turns = Alternated(calls, world.Barrier)
    p = dist.get_world_size()
    benchmark.group = f"all_reduce {mb} MB floor, alternated, {p} ranks"
    turns.run(benchmark, 3 * ALTERNATED_ROUNDS)
    group = f"one {mb} MB all_reduce: the floor, alternated call by call ({p} ranks)"
    turns.record(benchmark, record_bandwidth, group, f"{mb}MB", ref="gloo", what="call")
    comm.close()
    shm.close()


@pytest.mark.parametrize("impl", ["commrt", "gloo"])
def test_fsdp_step(benchmark, record_bandwidth, groups, impl):
    group = groups[impl] or dist.group.WORLD
    mesh = DeviceMesh.from_group(group, "cpu")
    model = _mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = _batch()
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    _run(benchmark, record_bandwidth, step, "FSDP2 step", impl)
