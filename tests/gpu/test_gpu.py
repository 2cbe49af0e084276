"""NCCL and the Triton kernels on real GPUs. Skipped (with the reason) where there is no CUDA.

Every test runs its GPU work in a spawned process with ``TRITON_INTERPRET``
removed from its environment: tests/conftest.py sets it for the CPU tests,
and a GPU worker that inherited it would run the kernels in Triton's
interpreter (or refuse CUDA tensors), never the compiled GPU path. A
worker that hangs is killed at the test's timeout and the test fails.

Two-rank tests need two GPUs (NCCL refuses two ranks on one device); the
rest run as-is on one GPU (an H100 box): bf16 wire dtype through the
compiled kernels, a local rank that is not the device index, no second
CUDA context on GPU 0, a timeout in communicator creation that leaves
the process able to exit (the watchdog), and the torch backend's CUDA path
with the caller on a side stream (its calls ordered after that stream).
"""

import copy
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from helpers.gpu import spawn

import commrt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _compiled() -> bool:
    from commrt.kernels._triton import interpret_mode

    return not interpret_mode()


def _worker(rank, world, port, q):
    try:
        comm = commrt.init(
            "nccl",
            rank=rank,
            world_size=world,
            master_addr="127.0.0.1",
            master_port=port,
            device=torch.device("cuda", rank),
            timeout=60,
        )
        errs = []
        for n in (1, 7, 1000, 1_000_003):
            for dt in (torch.float32, torch.bfloat16):
                g = torch.Generator().manual_seed(rank * 100 + n)
                x = torch.randn(n, generator=g).to(dt).cuda(rank)
                native = x.clone()
                comm.transport.native_all_reduce(native, "sum")
                for alg in ("ring", "halving_doubling"):
                    t = x.clone()
                    commrt.all_reduce(t, comm, algorithm=alg, op="sum")
                    torch.cuda.synchronize()
                    tol = 1e-5 if dt == torch.float32 else world * 2**-8 * 8
                    err = (t.double() - native.double()).abs().max().item()
                    if err > tol:
                        errs.append((n, str(dt), alg, err))
        comm.close()
        q.put((rank, errs))
    except Exception as e:  # reported to the test process
        q.put((rank, repr(e)))


def _two_ranks(worker) -> dict:
    """Run ``worker(rank, 2, port, queue)`` on two spawned processes; {rank: what it reported}."""
    port = _port()
    return spawn([(worker, (r, 2, port)) for r in range(2)])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs for two ranks")
def test_nccl_all_reduce_matches_ncclAllReduce():
    results = _two_ranks(_worker)
    assert results == {0: [], 1: []}, results


def _sync_worker(rank, world, port, q):
    try:
        comm = commrt.init(
            "nccl",
            rank=rank,
            world_size=world,
            master_addr="127.0.0.1",
            master_port=port,
            device=torch.device("cuda", rank),
            timeout=60,
        )
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
        ).cuda(rank)
        ref = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank)).cuda(rank)
        with commrt.GradientSync(
            model, comm, bucket_mb=0.05, first_bucket_mb=0.01, trace=True
        ) as sync:
            model(x).square().mean().backward()
            sync.step(opt)
        # expected: the average of both ranks' gradients, computed here on the CPU
        grads = []
        for r in range(world):
            m = torch.nn.Sequential(
                torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
            )
            with torch.no_grad():
                for p, v in zip(m.parameters(), ref):
                    p.copy_(v.cpu())
            m(
                torch.randn(8, 64, generator=torch.Generator().manual_seed(r))
            ).square().mean().backward()
            grads.append([p.grad for p in m.parameters()])
        errs = [
            ((p.detach().cpu() - (r0.cpu() - 0.1 * (g0 + g1) / 2)).abs().max().item())
            for p, r0, g0, g1 in zip(model.parameters(), ref, *grads)
        ]
        comm.close()
        q.put((rank, [e for e in errs if e > 1e-5]))
    except Exception as e:  # reported to the test process
        q.put((rank, repr(e)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs for two ranks")
def test_gradient_sync_on_two_gpus():
    results = _two_ranks(_sync_worker)
    assert results == {0: [], 1: []}, results


def _world_of_one(q):
    try:
        comm = commrt.init("nccl", rank=0, world_size=1, device=torch.device("cuda", 0), timeout=60)
        t = torch.arange(10.0, device="cuda")
        commrt.all_reduce(t, comm, op="sum")
        comm.barrier()
        ok = torch.equal(t.cpu(), torch.arange(10.0))
        comm.close()
        q.put(("result", (ok, _compiled())))
    except Exception as e:  # reported to the test process
        q.put(("result", repr(e)))


def test_nccl_world_of_one_on_gpu():
    assert spawn([(_world_of_one, ())]) == {"result": (True, True)}


def _last_gpu_worker(q):
    """Rank 0 of 1 on the last GPU, one GradientSync step; is there a context on GPU 0?"""
    try:
        dev = torch.device("cuda", torch.cuda.device_count() - 1)
        comm = commrt.init("nccl", rank=0, world_size=1, device=dev, timeout=60)
        model = torch.nn.Linear(64, 64).to(dev)
        with commrt.GradientSync(model, comm, bucket_mb=0.01) as sync:
            model(torch.randn(8, 64, device=dev)).square().mean().backward()
            sync.step(torch.optim.SGD(model.parameters(), lr=0.1))
        torch.cuda.synchronize(dev)
        comm.close()
        q.put(("result", ("ok", bool(torch._C._cuda_hasPrimaryContext(0)))))
    except Exception as e:  # reported to the test process
        q.put(("result", ("error", repr(e))))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a GPU other than GPU 0")
def test_progress_thread_makes_no_context_on_gpu_0():
    """The progress thread sets its device: a rank on another GPU never
    creates a CUDA context on GPU 0. A fresh process, so nothing else made one first."""
    assert spawn([(_last_gpu_worker, ())]) == {"result": ("ok", False)}


def _device_cuda_worker(q):
    try:
        comm = commrt.init("nccl", rank=0, world_size=1, device="cuda", timeout=60)
        q.put(("result", str(comm.device)))
        comm.close()
    except Exception as e:  # reported to the test process
        q.put(("result", repr(e)))


def test_nccl_device_cuda_without_an_index_gets_one():
    assert spawn([(_device_cuda_worker, ())]) == {"result": "cuda:0"}  # local rank 0 alone


# ------------------------------------------------------------ one GPU is enough


def _bf16_worker(q):
    """GradientSync with a bf16 wire dtype on one GPU: the compiled pack/unpack kernels round
    each fp32 gradient once to bf16 (world of one: the average is the gradient itself)."""
    try:
        dev = torch.device("cuda", 0)
        comm = commrt.init("nccl", rank=0, world_size=1, device=dev, timeout=60)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Linear(300, 7)).to(dev)
        ref = copy.deepcopy(model)
        x = torch.randn(16, 64, device=dev)
        ref(x).square().mean().backward()
        with commrt.GradientSync(
            model, comm, comm_dtype=torch.bfloat16, bucket_mb=0.05, first_bucket_mb=0.01
        ) as sync:
            model(x).square().mean().backward()
            sync.wait()
            got = [p.grad.float() for p in model.parameters()]
        want = [r.grad.to(torch.bfloat16).float() for r in ref.parameters()]
        err = max(float((g - w).abs().max()) for g, w in zip(got, want))
        rounded = any(not torch.equal(g, r.grad) for g, r in zip(got, ref.parameters()))
        comm.close()
        q.put(("result", (err <= 1e-6, rounded, _compiled())))
    except Exception as e:  # reported to the test process
        q.put(("result", repr(e)))


def test_bf16_wire_dtype_through_the_compiled_kernels():
    assert spawn([(_bf16_worker, ())]) == {"result": (True, True, True)}


def _gpus_with_a_context() -> list[int]:
    """The GPUs this process holds a CUDA context on. Asked of the process itself: nvidia-smi
    lists processes by their PIDs in the host's PID namespace, which in a container are not
    what ``os.getpid()`` returns, so matching the two finds nothing there."""
    return [i for i in range(torch.cuda.device_count()) if torch._C._cuda_hasPrimaryContext(i)]


def _local_rank_worker(q):
    """LOCAL_RANK is the device count (so the device index differs from the local rank):
    init, an all-reduce and a GradientSync step on the device it picks; then the GPUs this
    process made a context on."""
    try:
        comm = commrt.init("nccl", timeout=60)  # rank, world and local rank from torchrun vars
        dev = comm.device
        t = torch.arange(6.0, device=dev)
        commrt.all_reduce(t, comm, op="sum")
        model = torch.nn.Linear(32, 8).to(dev)
        with commrt.GradientSync(model, comm, bucket_mb=0.01) as sync:
            model(torch.randn(4, 32, device=dev)).sum().backward()
            sync.step(torch.optim.SGD(model.parameters(), lr=0.1))
        torch.cuda.synchronize(dev)
        contexts = _gpus_with_a_context()
        comm.close()
        q.put(("result", (str(dev), torch.equal(t.cpu(), torch.arange(6.0)), contexts)))
    except Exception as e:  # reported to the test process
        q.put(("result", repr(e)))


def test_local_rank_other_than_the_device_index_and_one_context_on_gpu_0():
    n = torch.cuda.device_count()
    env = dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=n, LOCAL_WORLD_SIZE=n + 1)
    got = spawn([(_local_rank_worker, ())], MASTER_ADDR="127.0.0.1", MASTER_PORT=_port(), **env)
    result = got["result"]
    assert isinstance(result, tuple), result
    device, ok, contexts = result
    assert device == "cuda:0" and ok, result  # local rank n on n GPUs: device 0
    assert contexts == [0], result  # a context on GPU 0, and on no other GPU


_STUCK_INIT = """
import sys, time, torch, commrt
start = time.monotonic()
print("start", flush=True)
try:
    commrt.init("nccl", rank=0, world_size=2, device="cuda:0", timeout=5,
                master_addr="127.0.0.1", master_port=int(sys.argv[1]), abort_on_error=False)
except Exception as e:
    print("raised", type(e).__name__, e, flush=True)
    sys.exit(3)
print("returned", flush=True)
"""


def test_a_communicator_timeout_leaves_the_process_able_to_exit():
    """Rank 1 of 2 never comes: NCCL waits for it inside communicator creation (C code, no
    timeout). The watchdog (5 s, then 5 s grace) ends the process with the named error, or
    the store's own 5 s timeout raises first: either way the process exits, it never hangs."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _STUCK_INIT, str(_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "returned" not in out, out
    assert "creating the NCCL communicator" in out or "raised" in out, out
    assert elapsed < 5 + 5 + 60, (elapsed, out)  # 60 s for importing torch/cupy and CUDA init


# ------------------------------------------------------------ the torch backend's CUDA path

#: GPU cycles the caller's side stream sleeps before it writes a call's input: long enough
#: that a collective not ordered after that stream runs first and copies the old values
SIDE_STREAM_SLEEP_CYCLES = 1 << 30


def _side_stream_worker(q):
    """Rank 0 of 1 on backend "commrt" with CUDA tensors, the caller on a side stream that
    is busy when it writes each call's input: with one rank, all_gather_into_tensor and
    reduce_scatter_tensor copy the input to the output, so an output that holds the old
    values means the call ran before the caller's write (or the caller read it before the
    call's copy). Then the plain calls once each, and what the group was made with."""
    try:
        import datetime

        import torch.distributed as dist

        import commrt  # noqa: F401  (registers the "commrt" backend)

        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        dist.init_process_group("commrt", timeout=datetime.timedelta(seconds=77))
        n, got = 1 << 20, {}
        side = torch.cuda.Stream(dev)
        calls = {
            "all_gather": lambda o, i, a: dist.all_gather_into_tensor(o, i, async_op=a),
            "reduce_scatter": lambda o, i, a: dist.reduce_scatter_tensor(o, i, async_op=a),
        }
        for name, call in calls.items():
            for async_op in (False, True):
                inp, out = torch.zeros(n, device=dev), torch.zeros(n, device=dev)
                torch.cuda.synchronize(dev)
                with torch.cuda.stream(side):
                    torch.cuda._sleep(SIDE_STREAM_SLEEP_CYCLES)
                    inp.fill_(7.0)
                    work = call(out, inp, async_op)
                    if async_op:
                        work.wait()
                    got[f"{name} async={async_op}"] = out.min().item()  # read on the side stream
        t = torch.arange(8.0, device=dev)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            dist.all_reduce(t, op=op)
        dist.broadcast(t, 0)
        got["plain"] = torch.equal(t.cpu(), torch.arange(8.0))
        transport = dist.group.WORLD.devices.ready(dev).comm.transport
        got["nccl"] = (str(transport.device), transport.timeout)
        dist.destroy_process_group()
        q.put(("result", got))
    except Exception as e:  # reported to the test process
        q.put(("result", repr(e)))


def test_torch_backend_orders_after_the_callers_side_stream():
    """The call thread orders each call after an event recorded on the caller's
    current stream when it was made (current streams are per thread), and wait() orders the
    caller's streams after the call; NCCL is made on the call's device with the group's
    timeout."""
    env = dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, MASTER_ADDR="127.0.0.1")
    got = spawn([(_side_stream_worker, ())], MASTER_PORT=_port(), **env)["result"]
    assert isinstance(got, dict), got
    for name in ("all_gather", "reduce_scatter"):
        for async_op in (False, True):
            assert got[f"{name} async={async_op}"] == 7.0, got
    assert got["plain"] and got["nccl"] == ("cuda:0", 77.0), got


def _call_thread_device_worker(q):
    """Rank 0 of 1 whose tensors live on the last GPU while the caller's current device is
    GPU 0 and has no context yet: the group's calls must make none there either."""
    try:
        import torch.distributed as dist

        import commrt  # noqa: F401  (registers the "commrt" backend)

        dev = torch.device("cuda", torch.cuda.device_count() - 1)
        dist.init_process_group("commrt")
        t = torch.ones(1000, device=dev)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            dist.all_reduce(t, op=op)
        out = torch.empty(1000, device=dev)
        dist.all_gather_into_tensor(out, t)
        torch.cuda.synchronize(dev)
        contexts = _gpus_with_a_context()
        dist.destroy_process_group()
        q.put(("result", (torch.equal(out.cpu(), torch.ones(1000)), contexts)))
    except Exception as e:  # reported to the test process
        q.put(("result", repr(e)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a GPU other than GPU 0")
def test_torch_backend_call_thread_makes_no_context_on_gpu_0():
    """The call thread sets the group's device itself; without it, leaving a
    stream context there restored device 0's stream and every rank made a context on GPU 0."""
    n = torch.cuda.device_count()
    env = dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, MASTER_ADDR="127.0.0.1")
    got = spawn([(_call_thread_device_worker, ())], MASTER_PORT=_port(), **env)["result"]
    assert got == (True, [n - 1]), got
