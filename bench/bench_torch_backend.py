"""DDP and FSDP2 over the "commrt" torch.distributed backend vs over gloo::

    mpiexec -n 2 python -m pytest bench/bench_torch_backend.py --benchmark-only
    mpiexec -n 4 python -m pytest bench/bench_torch_backend.py --benchmark-only

The default group is commrt's (under mpiexec its CPU traffic goes over MPI;
COMMRT_ALGORITHM picks the all-reduce, default auto); the reference is a
gloo group of the same ranks, in the same processes.

* ``test_ddp_step``: one DDP training step (forward, backward with the
  bucketed all-reduces, SGD) of the ~25M-parameter MLP of
  bench_gradsync.py (100 MB of fp32 gradients). Goal: commrt ≤ 0.8× gloo at
  2 ranks.
  On a shared machine the two variants, run one after the other, measure
  the load as much as the backend: bench/ddp_alternating.py alternates them
  step by step, next to the compute floor (no communication).
* ``test_fsdp_step``: the same MLP under FSDP2 (``fully_shard`` per layer):
  all-gathers in forward and backward, reduce-scatters in backward.
"""

import pytest
import torch
import torch.distributed as dist
from bench_gradsync import IN, OUT, _mlp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import commrt  # noqa: F401  (registers the backend)
from commrt.cli.launch import already_launched, free_port

pytestmark = pytest.mark.skipif(
    not already_launched(),
    reason="multi-rank benchmark: run under mpiexec -n 2 python -m pytest ...",
)

ROUNDS, ITERS = 5, 2


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
    yield {"commrt": None, "gloo": init_commrt_over_mpi()}
    dist.destroy_process_group()


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
