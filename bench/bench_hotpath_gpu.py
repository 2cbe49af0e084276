"""The hot path on a CUDA GPU: host time per call, and a step against a plain one.

From the repository root, on a machine with a CUDA GPU (step 5 of
``tools/gpu_check.py`` runs it)::

    python -m pytest bench/bench_hotpath_gpu.py --benchmark-only

* ``test_pack_unpack_host_us``: host µs per call of ``pack`` and ``unpack``
  (fp32, scale 1/8) for 8, 163 and 1,324 tensors (bench_kernels.py's
  ``resnet50`` layout at 16 and 100 MB, its ``small`` layout at 100 MB),
  beside the goal of 8 µs whatever the count;
* ``test_reduce_host_us``: host µs per call of ``reduce_`` on a 16 MB bucket,
  fp32 += bf16 and fp32 += fp32, beside the goal of 6 µs.

  Both time the launches alone with ``time.perf_counter`` while the GPU is
  still busy with a ``torch.cuda._sleep`` queued before them
  (cuda_timing.py), so no call waits for the GPU.
* ``test_step_at_one_rank``: a ResNet-50 (torchvision's if installed, else the
  same layers built here from plain torch: the same 161 parameter tensors)
  at batch 32 on one rank, steps of each variant taking turns: a plain step
  (backward, SGD), GradientSync over a world of one on NCCL with an fp32 and
  with a bf16 wire, and DDP on backend ``"commrt"`` and on ``"nccl"`` (one
  process: the default group is NCCL's, the commrt group a ``new_group`` of
  the same rank). Wall ms per step (ending in a synchronisation), each over
  the plain step (goals: fp32 1.01x, bf16 wire 1.03x) and DDP commrt over
  DDP nccl (goal 1.02x).

* ``test_executor_step_over_cuda_ipc``: two ranks on the one GPU (spawned
  processes, NCCL refusing two ranks on one device), a ring all-reduce of
  256 B over ``cuda_ipc``: wall µs per call over the schedule's steps, on
  rank 0, the median of 5 timed blocks, each ended by a synchronisation (the bytes moved are
  nothing, so this is the executor and the transport's host work per step),
  beside the goal of 15 µs.
* ``test_all_reduce_gbs_over_cuda_ipc``: the same two ranks, a ring all-reduce
  (AVG, fp32) of 1, 4, 16 and 64 MB: GB/s (the tensor's bytes over the wall
  time per call, median of 5 blocks) against ``Tensor.copy_`` of the same
  bytes on rank 0 alone (the GPU's copy bandwidth, counted the same way).

Not here, and reported as such by tools/gpu_check.py: a bucket's schedule
replayed as one CUDA graph (not built in the library). Every case is skipped
with a reason where there is no CUDA GPU; none has run on a GPU yet.
"""

from __future__ import annotations

import os
import queue
import socket
import statistics
import time
from functools import partial

import pytest
import torch
from bench_kernels import bucket_shapes, cuda_skip_reason
from cuda_timing import host_seconds

from commrt.cli.bench import time_calls

PACK_GOAL_US, REDUCE_GOAL_US, IPC_STEP_GOAL_US = 8.0, 6.0, 15.0
#: timed blocks of calls in each cuda_ipc rank (the figure is the median block's)
IPC_BLOCKS = 5
#: all-reduce sizes over cuda_ipc (MB) -> calls per timed block
IPC_MB = {1: 40, 4: 20, 16: 10, 64: 5}
#: goals of a step over the plain step, and of DDP on commrt over DDP on NCCL
STEP_GOALS = {"sync fp32": 1.01, "sync bf16": 1.03, "ddp commrt": 1.02}
#: tensor count -> (bench_kernels layout, bucket MB) that holds that many tensors
COUNTS = {8: ("resnet50", 16), 163: ("resnet50", 100), 1324: ("small", 100)}
BATCH, ROUNDS = 32, 15
MB = 1 << 20

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_skip_reason() is not None, reason=str(cuda_skip_reason())),
]


@pytest.mark.parametrize("op", ["pack", "unpack"])
@pytest.mark.parametrize("count", list(COUNTS))
def test_pack_unpack_host_us(benchmark, record_bandwidth, count, op):
    from commrt.kernels import pack, unpack

    layout, mb = COUNTS[count]
    grads = [torch.randn(s, device="cuda") for s in bucket_shapes(layout, mb * MB)]
    assert len(grads) == count, len(grads)
    bucket = torch.empty(sum(g.numel() for g in grads), device="cuda")
    if op == "pack":
        fn = lambda: pack(grads, bucket, 1 / 8)  # noqa: E731
    else:
        fn = lambda: unpack(bucket, grads, 1 / 8)  # noqa: E731
    fn()  # compiles, builds the table
    torch.cuda.synchronize()
    got = []
    benchmark.group = "host µs per call, the GPU kept busy"
    benchmark.pedantic(lambda: got.append(host_seconds(fn)), rounds=ROUNDS, iterations=1)
    us = statistics.median(got) * 1e6
    benchmark.extra_info.update(host_us=us, tensors=count, goal_us=PACK_GOAL_US)
    record_bandwidth(benchmark.group, op, f"{count} t", host_us=us, goal=PACK_GOAL_US)


@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_reduce_host_us(benchmark, record_bandwidth, src_dtype):
    from commrt.kernels import reduce_

    dst = torch.randn(16 * MB // 4, device="cuda")
    src = torch.randn(dst.numel(), device="cuda").to(src_dtype)
    reduce_(dst, src)
    torch.cuda.synchronize()
    got = []
    benchmark.group = "host µs per call, the GPU kept busy"
    benchmark.pedantic(lambda: got.append(host_seconds(lambda: reduce_(dst, src))),
                       rounds=ROUNDS, iterations=1)  # fmt: skip
    us = statistics.median(got) * 1e6
    benchmark.extra_info.update(host_us=us, goal_us=REDUCE_GOAL_US)
    name = f"reduce_ += {src.dtype}".replace("torch.", "")
    record_bandwidth(benchmark.group, name, "16MB", host_us=us, goal=REDUCE_GOAL_US)


class Bottleneck(torch.nn.Module):
    """ResNet-50's block: 1x1, 3x3, 1x1 convolutions with batch norm, and a
    downsampling shortcut in the first block of a stage."""

    def __init__(self, inp: int, width: int, stride: int):
        super().__init__()
        nn, out = torch.nn, width * 4
        self.body = nn.Sequential(
            nn.Conv2d(inp, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out),
        )  # fmt: skip
        self.down = None
        if stride != 1 or inp != out:
            self.down = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False),
                                      nn.BatchNorm2d(out))  # fmt: skip

    def forward(self, x):
        return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))


def resnet50() -> torch.nn.Module:
    """torchvision's ResNet-50, or the same layers from plain torch where it is missing."""
    try:
        from torchvision.models import resnet50 as tv
    except ImportError:
        return plain_resnet50()
    return tv()


def plain_resnet50() -> torch.nn.Module:
    """ResNet-50 from plain torch layers: torchvision's parameter tensors, in its order."""
    nn, layers, inp = torch.nn, [], 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for b in range(blocks):
            layers.append(Bottleneck(inp, width, 2 if b == 0 and stage > 0 else 1))
            inp = width * 4
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2048, 1000),
    )  # fmt: skip


def _steps(dist, comm):
    """Variant -> one training step of its own ResNet-50 (same weights), ending in a
    synchronisation."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import commrt

    x = torch.randn(BATCH, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (BATCH,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()
    commrt_group = dist.new_group([0], backend="commrt")

    def make(kind):
        torch.manual_seed(0)
        model = resnet50().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        if kind.startswith("ddp"):
            group = commrt_group if kind == "ddp commrt" else None
            net = DDP(model, device_ids=[0], process_group=group)
        else:
            net = model
        sync = None
        if kind.startswith("sync"):
            wire = torch.bfloat16 if kind == "sync bf16" else None
            sync = commrt.GradientSync(model, comm, comm_dtype=wire)

        def step():
            loss_fn(net(x), y).backward()
            if sync is None:
                opt.step()
                opt.zero_grad()
            else:
                sync.step(opt)
            torch.cuda.synchronize()

        return step

    return {k: make(k) for k in ("plain", "sync fp32", "sync bf16", "ddp commrt", "ddp nccl")}


def test_step_at_one_rank(benchmark, record_bandwidth, tmp_path):
    import torch.distributed as dist

    import commrt

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    comm = commrt.init("nccl", rank=0, world_size=1, device="cuda", timeout=120)
    try:
        steps = _steps(dist, comm)
        wall = {k: [] for k in steps}

        def one_round():  # every variant once, in an order that flips each round
            order = list(steps) if len(wall["plain"]) % 2 == 0 else list(steps)[::-1]
            for k in order:
                t0 = time.perf_counter()
                steps[k]()
                wall[k].append(time.perf_counter() - t0)

        for _ in range(2):  # DDP rebuilds its buckets after the first step
            one_round()
        for w in wall.values():
            w.clear()
        benchmark.group = f"ResNet-50 step at 1 rank, batch {BATCH}, alternated"
        benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    finally:
        comm.close()
        dist.destroy_process_group()
    med = {k: statistics.median(w) for k, w in wall.items()}
    for k, t in med.items():
        ref = "ddp nccl" if k == "ddp commrt" else "plain"
        cols = {"step_ms": t * 1e3, f"x_{ref.split()[-1]}": t / med[ref]}
        if k in STEP_GOALS:
            cols["goal"] = STEP_GOALS[k]
        benchmark.extra_info[k] = cols
        record_bandwidth(benchmark.group, k, "25.6M", **cols)


def ipc_comm(rank: int, n: int, port: int, make_device=None):
    """(In a spawned rank.) A ``cuda_ipc`` communicator of ``n`` ranks meeting at ``port``;
    ``make_device``: a factory of the transport's device (a CPU stand-in), default the GPU."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    import commrt
    from commrt.testing import engines

    with engines(cuda_ipc=make_device() if make_device else None):
        return commrt.init("cuda_ipc", timeout=120, stall_s=0)


def ipc_rank(rank: int, n: int, port: int, q, calls: int, make_device=None) -> None:
    """(A spawned rank.) Seconds per ring all-reduce of 64 floats over ``cuda_ipc``
    (:func:`~commrt.cli.bench.time_calls`: the median of :data:`IPC_BLOCKS` blocks of
    ``calls``), after a warm-up; rank 0 puts (µs per step, steps) on ``q``, any rank its
    error."""
    try:
        import commrt
        from commrt.algorithms import resolve

        comm = ipc_comm(rank, n, port, make_device)
        x = torch.ones(64, device=comm.device)
        for _ in range(20):
            commrt.all_reduce(x, comm, algorithm="ring", op="sum")
        reduce = partial(commrt.all_reduce, x, comm, algorithm="ring", op="sum")
        seconds = time_calls(comm, reduce, calls, IPC_BLOCKS)
        steps = resolve("ring").schedule(n).num_steps
        comm.close()
        if rank == 0:
            q.put((seconds / steps * 1e6, steps))
    except Exception as e:  # reported by the benchmark
        q.put(repr(e))


def ipc_bandwidth_rank(rank: int, n: int, port: int, q, sizes: dict, make_device=None) -> None:
    """(A spawned rank.) Per size in ``sizes`` (MB -> calls per block): seconds per ring
    all-reduce (AVG, fp32) over ``cuda_ipc``, and, on rank 0 alone while the others wait,
    seconds per ``Tensor.copy_`` of the same bytes; rank 0 puts {MB: (all-reduce s,
    copy s)} on ``q``, any rank its error."""
    try:
        import commrt

        comm = ipc_comm(rank, n, port, make_device)
        got = {}
        for mb, calls in sizes.items():
            x = torch.ones(mb * MB // 4, device=comm.device)
            reduce = partial(commrt.all_reduce, x, comm, algorithm="ring", op="avg")
            for _ in range(3):
                reduce()
            seconds = time_calls(comm, reduce, calls, IPC_BLOCKS)
            y = torch.empty_like(x)
            alone = _Alone(comm)
            copy = time_calls(alone, partial(y.copy_, x), calls, IPC_BLOCKS) if rank == 0 else 0.0
            comm.barrier()
            got[mb] = (seconds, copy)
        comm.close()
        if rank == 0:
            q.put(got)
    except Exception as e:  # reported by the benchmark
        q.put(repr(e))


class _Alone:
    """A communicator's device, with a barrier of one rank (rank 0 times alone)."""

    def __init__(self, comm):
        self.device = comm.device

    def barrier(self) -> None:
        pass


def run_ipc_ranks(target=ipc_rank, *args, n: int = 2, make_device=None, timeout: float = 90):
    """What rank 0 of ``n`` spawned ``target(rank, n, port, q, *args, make_device)``
    processes put on its queue (:func:`ipc_rank`, :func:`ipc_bandwidth_rank`)."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, n, port, q, *args, make_device))
             for r in range(n)]  # fmt: skip
    for p in procs:
        p.start()
    try:
        got = q.get(timeout=timeout)
    except queue.Empty:
        got = f"no rank reported within {timeout:.0f} s"
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if isinstance(got, str):
        raise RuntimeError(f"a cuda_ipc rank failed: {got}")
    return got


def test_executor_step_over_cuda_ipc(benchmark, record_bandwidth):
    got = []
    benchmark.group = "executor per step over cuda_ipc, 2 ranks on one GPU"
    # one launch (the ranks' start-up is seconds); the blocks are timed in the ranks
    benchmark.pedantic(lambda: got.append(run_ipc_ranks(ipc_rank, 500)), rounds=1, iterations=1)
    us, steps = got[0]
    benchmark.extra_info.update(us_step=us, steps=steps, goal_us=IPC_STEP_GOAL_US)
    record_bandwidth(benchmark.group, "ring p=2", "256B", us_step=us, goal=IPC_STEP_GOAL_US)


def test_all_reduce_gbs_over_cuda_ipc(benchmark, record_bandwidth):
    got = []
    benchmark.group = "all-reduce over cuda_ipc, 2 ranks on one GPU"
    run = lambda: got.append(run_ipc_ranks(ipc_bandwidth_rank, IPC_MB))  # noqa: E731
    benchmark.pedantic(run, rounds=1, iterations=1)
    for mb, (seconds, copy) in got[0].items():
        gbs, copy_gbs = mb * MB / seconds / 1e9, mb * MB / copy / 1e9
        benchmark.extra_info[f"{mb}MB"] = {"GB/s": gbs, "copy GB/s": copy_gbs}
        record_bandwidth(benchmark.group, "ring avg fp32", f"{mb}MB", GB_s=gbs,
                         copy_GB_s=copy_gbs, of_copy=gbs / copy_gbs)  # fmt: skip
