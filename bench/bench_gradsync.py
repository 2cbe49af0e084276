"""GradientSync vs PyTorch DDP, and overlap with backward.

From the repository root, after ``pip install -e '.[dev]'``, on 2 ranks::

    mpiexec -n 2 python -m pytest bench/bench_gradsync.py --benchmark-only

* ``test_mlp_step``: an MLP of ~25M parameters (100 MB of fp32 gradients),
  one training step (forward, backward, gradient sync, SGD) per call, for
  commrt over MPI, commrt over gloo and DDP over gloo. Recorded per case:
  step time, communication time, exposed (non-overlapped) communication,
  and the extra memory GradientSync holds (flat buffers + scratch) next to
  the gradient size.
* ``test_mlp_step_alternated``: the same MLP under four variants that take
  turns step by step in the same processes (an order that flips every
  round, a barrier before each step), so that a shared machine's load
  falls on all alike (run one after the other, as ``test_mlp_step`` runs
  them, they measure the load as much as the code): ``local`` (no
  synchronisation: the compute floor), ``ddp-nocomm`` (DDP whose
  communication hook hands each bucket back untouched: DDP's own bucket
  copies and reducer, the floor for any backend), ``commrt-mpi``
  (GradientSync over MPI) and ``ddp-gloo``. Per variant: median wall
  and process CPU time (all threads) per step, and wall time over
  ``ddp-gloo``'s.
* ``test_small_layers_step``: 50 small layers (~1 MB of gradients), where
  a step is all overhead: per-step cost of GradientSync (hooks, progress
  thread, per-bucket pack/run/unpack, stats) and of DDP over gloo, each
  against the same step without any synchronisation.
* ``test_overlap``: a model whose backward is dominated by emulated
  accelerator compute (a layer whose backward sleeps, leaving the CPU to
  communication, as a GPU would), so backward takes clearly longer than
  communication. Reports backward alone (no_sync), communication alone
  (wait() on a step without gradients reduces every bucket), and the
  overlapped step; overlap is real when step << backward + communication.
"""

import os
import socket
import statistics
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commrt
from commrt.cli.bench import DelayBackward
from commrt.cli.launch import already_launched

pytestmark = pytest.mark.skipif(
    not already_launched(),
    reason="multi-rank benchmark: run under mpiexec -n 2 python -m pytest ...",
)

ROUNDS, ITERS = 5, 2
ALTERNATED_ROUNDS = 10


IN, HIDDEN, OUT = 512, 2560, 10


def _mlp():
    torch.manual_seed(0)
    # 512*2560 + 3*2560*2560 + 2560*1536 + 1536*10 ~= 24.9M parameters (~100 MB of fp32 gradients)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1536),
        torch.nn.ReLU(),
        torch.nn.Linear(1536, OUT),
    )


@pytest.fixture(scope="module")
def env():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        port = None
    port = world.bcast(port)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=world.Get_rank(),
        world_size=world.Get_size(),
    )
    comms = {"mpi": commrt.init("mpi", timeout=120), "gloo": commrt.init("gloo", timeout=120)}
    yield comms
    for c in comms.values():
        c.close()
    dist.destroy_process_group()


def _no_communication(state, bucket):
    """A DDP communication hook that communicates nothing (the ``ddp-nocomm`` floor)."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


class Alternated:
    """Variants that take turns: one step of each per round, in an order that flips every
    round, each after ``barrier()``. Wall and CPU seconds (the process's, every thread,
    kernel time included) per variant and step."""

    def __init__(self, steps: dict, barrier):
        self.steps, self.barrier = steps, barrier
        self.wall = {v: [] for v in steps}
        self.cpu = {v: [] for v in steps}

    def __call__(self) -> None:
        names = list(self.steps)
        for v in names if len(self.wall[names[0]]) % 2 == 0 else names[::-1]:
            self.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            self.steps[v]()
            self.wall[v].append(time.perf_counter() - t0)
            self.cpu[v].append(time.process_time() - c0)

    def run(self, benchmark, rounds: int) -> None:
        """Two untimed steps of each (DDP rebuilds its buckets after the first), then
        ``rounds`` rounds as the benchmark's (fixed count: collectives line up on every rank)."""
        for step in self.steps.values():
            step()
            step()
        benchmark.pedantic(self, rounds=rounds, iterations=1, warmup_rounds=0)

    def record(
        self, benchmark, record_bandwidth, group: str, size: str, ref: str, what: str = "step"
    ) -> None:
        """Per variant: median wall and CPU ms per ``what``, and wall time over ``ref``'s."""
        base = statistics.median(self.wall[ref])
        for v in self.steps:
            wall = statistics.median(self.wall[v])
            cols = {
                f"{what}_ms": wall * 1e3,
                "cpu_ms": statistics.median(self.cpu[v]) * 1e3,
                f"vs_{ref}": wall / base,
            }
            benchmark.extra_info[v] = dict(cols, wall_s=self.wall[v], cpu_s=self.cpu[v])
            record_bandwidth(group, v, size, **cols)


def _rss_mb():
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


@pytest.mark.parametrize("impl", ["commrt-mpi", "commrt-gloo", "ddp-gloo"])
def test_mlp_step(benchmark, record_bandwidth, env, impl):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, IN)
    y = torch.randint(0, OUT, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()
    grad_mb = sum(p.numel() for p in model.parameters()) * 4 / 2**20
    rss0 = _rss_mb()
    sync = None
    if impl == "ddp-gloo":
        net = DDP(model)

        def step():
            loss_fn(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    else:
        sync = commrt.GradientSync(model, env[impl.split("-")[1]])

        def step():
            loss_fn(model(x), y).backward()
            sync.step(opt)

    benchmark.group = "GradientSync vs DDP, MLP 25M params, 2 ranks"
    benchmark.pedantic(step, rounds=ROUNDS, iterations=ITERS, warmup_rounds=1)
    info = {
        "step_ms": benchmark.stats.stats.median * 1e3,
        "rss_growth_MB": _rss_mb() - rss0,
        "grad_MB": grad_mb,
    }
    if sync is not None:
        m = sync.stats.mean(skip=2)
        info.update(
            comm_ms=(m.pack_s + m.comm_s + m.unpack_s) * 1e3,
            exposed_ms=m.exposed_s * 1e3,
            exposed_share=m.exposed_s / max(1e-9, m.pack_s + m.comm_s + m.unpack_s),
            extra_MB=sync.stats.buffer_bytes / 2**20,
            backward_ms=m.backward_s * 1e3,
        )
        sync.close()
    benchmark.extra_info.update(info)
    record_bandwidth("GradientSync vs DDP (MLP 25M, 2 ranks)", impl, "100MB", **info)


def test_mlp_step_alternated(benchmark, record_bandwidth, env):
    x, y = torch.randn(64, IN), torch.randint(0, OUT, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def stepper(variant):
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        if variant == "commrt-mpi":
            sync = commrt.GradientSync(model, env["mpi"])

            def step():
                loss_fn(model(x), y).backward()
                sync.step(opt)

            return step, sync
        net = model if variant == "local" else DDP(model)
        if variant == "ddp-nocomm":
            net.register_comm_hook(None, _no_communication)

        def step():
            loss_fn(net(x), y).backward()
            opt.step()
            opt.zero_grad()

        return step, None

    made = {v: stepper(v) for v in ("local", "ddp-nocomm", "commrt-mpi", "ddp-gloo")}
    turns = Alternated({v: s for v, (s, _) in made.items()}, env["mpi"].barrier)
    benchmark.group = "GradientSync vs DDP, alternated, MLP 25M params"
    turns.run(benchmark, ALTERNATED_ROUNDS)
    for _, sync in made.values():
        if sync is not None:
            sync.close()
    turns.record(
        benchmark,
        record_bandwidth,
        f"GradientSync vs DDP, alternated step by step (MLP 25M, {dist.get_world_size()} ranks)",
        "100MB",
        ref="ddp-gloo",
    )


def _small_layers(n=50, width=70):
    # 50 x (70*70 + 70) = 248,500 parameters: ~1 MB of fp32 gradients in 100 tensors
    torch.manual_seed(0)
    layers = [m for _ in range(n) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())]
    return torch.nn.Sequential(*layers)


@pytest.mark.parametrize("impl", ["local", "commrt-mpi", "commrt-gloo", "ddp-gloo"])
def test_small_layers_step(benchmark, record_bandwidth, env, impl):
    model = _small_layers()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 70)
    sync, net = None, model
    if impl == "ddp-gloo":
        net = DDP(model)
    elif impl != "local":
        sync = commrt.GradientSync(model, env[impl.split("-")[1]])

    def step():
        net(x).sum().backward()
        if sync is not None:
            sync.step(opt)
        else:
            opt.step()
            opt.zero_grad()

    benchmark.group = "50 small layers (1 MB of gradients), 2 ranks: per-step cost"
    env["mpi"].barrier()
    # fixed counts on every rank (DDP and commrt collectives must line up)
    benchmark.pedantic(step, rounds=7, iterations=50, warmup_rounds=1)
    info = {"step_us": benchmark.stats.stats.median * 1e6}
    if sync is not None:
        m = sync.stats.mean(skip=2)
        info.update(
            buckets=float(len(sync.buckets)),
            comm_us=(m.pack_s + m.comm_s + m.unpack_s) * 1e6,
            exposed_us=m.exposed_s * 1e6,
        )
        sync.close()
    benchmark.extra_info.update(info)
    record_bandwidth(
        "50 small layers (1 MB), 2 ranks: step time; overhead = step - local", impl, "1MB", **info
    )


class _DeviceLike(torch.nn.Module):
    # 8 layers of 2048x2048 (128 MB of gradients, ~30-40 ms to all-reduce here) with 15 ms of
    # emulated device time per layer: backward clearly longer than communication, both large
    def __init__(self, layers=8, width=2048, seconds=0.015):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.seconds = seconds

    def forward(self, x):
        for layer in self.layers:
            x = DelayBackward.apply(torch.relu(layer(x)), self.seconds)
        return x


@pytest.mark.parametrize("transport", ["mpi", "gloo"])
def test_overlap(benchmark, record_bandwidth, env, transport):
    comm = env[transport]
    model = _DeviceLike()
    x = torch.randn(8, 2048)
    sync = commrt.GradientSync(model, comm)

    def backward_only():
        with sync.no_sync():
            model(x).sum().backward()
        for p in model.parameters():
            p.grad = None

    def comm_only():
        sync.wait()  # no gradients this step: every bucket is reduced (as zeros)

    def step():
        model(x).sum().backward()
        sync.wait()
        for p in model.parameters():
            p.grad = None

    def median(fn, n=5):
        fn()
        ts = []
        for _ in range(n):
            comm.barrier()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[n // 2]

    t_bwd, t_comm = median(backward_only), median(comm_only)
    benchmark.group = f"overlap ({transport})"
    benchmark.pedantic(step, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    t_step = benchmark.stats.stats.median
    info = {
        "backward_ms": t_bwd * 1e3,
        "comm_ms": t_comm * 1e3,
        "step_ms": t_step * 1e3,
        "sum_ms": (t_bwd + t_comm) * 1e3,
        "hidden_share": (t_bwd + t_comm - t_step) / t_comm,
    }
    benchmark.extra_info.update(info)
    record_bandwidth(
        "overlap: backward (emulated device compute) vs communication", transport, "128MB", **info
    )
    sync.close()
