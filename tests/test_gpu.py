"""NCCL on real GPUs. Skipped (with the reason) where there is no CUDA.

These run as-is on a machine with two or more GPUs and cupy + NCCL
(pip install -e '.[dev,cuda]'): two spawned ranks, the unique id shared over
a TCPStore, results compared with ncclAllReduce and a float64 reference.
"""

import socket

import pytest
import torch
import torch.multiprocessing as mp

import commrt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=worker, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    return results


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


def test_nccl_world_of_one_on_gpu():
    comm = commrt.init("nccl", rank=0, world_size=1, device=torch.device("cuda", 0), timeout=60)
    t = torch.arange(10.0, device="cuda")
    commrt.all_reduce(t, comm, op="sum")
    comm.barrier()
    assert torch.equal(t.cpu(), torch.arange(10.0))
    comm.close()


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
        q.put(("ok", bool(torch._C._cuda_hasPrimaryContext(0))))
    except Exception as e:  # reported to the test process
        q.put(("error", repr(e)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a GPU other than GPU 0")
def test_progress_thread_makes_no_context_on_gpu_0():
    """The progress thread sets its device (issue 24): a rank on another GPU never
    creates a CUDA context on GPU 0. A fresh process, so nothing else made one first."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_last_gpu_worker, args=(q,))
    p.start()
    result = q.get(timeout=300)
    p.join(60)
    assert result == ("ok", False), result


def test_nccl_device_cuda_without_an_index_gets_one():
    comm = commrt.init("nccl", rank=0, world_size=1, device="cuda", timeout=60)
    assert comm.device == torch.device("cuda", 0)  # local rank 0 alone
    comm.close()
