"""The "commrt" torch.distributed backend on one GPU, against NCCL's own backend.

One rank, CUDA tensors: all_reduce (SUM, AVG), reduce_scatter_tensor (SUM,
AVG), all_gather_into_tensor and all_gather in fp32 and bf16, then three
steps of DDP (several buckets). The same program runs once on backend
"commrt" and once on "nccl", each in a fresh spawned process (a process
has one default group); results must be equal. With one rank every
collective hands back its input, which is checked too.

Then what a DDP user sees of commrt on CUDA tensors: its stats, the
``COMMRT_LOG`` lines and the ``COMMRT_TRACE`` files, under torchrun, one rank
per GPU on up to two GPUs (two ranks cannot share a GPU under NCCL). With two,
each bucket also names the schedule ``auto`` chose; a world of one runs none.

Skipped where there is no CUDA GPU; tools/gpu_check.py then reports these
checks as not run.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.gpu import spawn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]

N = 4099  # odd: no size lines up with a block or a chunk
DTYPES = (torch.float32, torch.bfloat16)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host(t: torch.Tensor) -> np.ndarray:
    """A plain array for the queue (fp32 holds bf16 exactly)."""
    return t.detach().float().cpu().numpy()


def _collectives(dev) -> dict:
    import torch.distributed as dist

    got = {}
    for dt in DTYPES:
        g = torch.Generator().manual_seed(7)
        x = (torch.randint(-50, 50, (N,), generator=g) / 4).to(dt).to(dev)
        got[f"input {dt}"] = _host(x)
        for op in ("SUM", "AVG"):
            t = x.clone()
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            got[f"all_reduce {op} {dt}"] = _host(t)
            out = torch.empty_like(x)
            dist.reduce_scatter_tensor(out, x.clone(), op=getattr(dist.ReduceOp, op))
            got[f"reduce_scatter {op} {dt}"] = _host(out)
        out = torch.empty_like(x)
        dist.all_gather_into_tensor(out, x)
        got[f"all_gather_into_tensor {dt}"] = _host(out)
        outs = [torch.empty_like(x)]
        dist.all_gather(outs, x)
        got[f"all_gather {dt}"] = _host(outs[0])
    return got


def _ddp(dev) -> list:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)
    ).to(dev)
    ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(16, 32, generator=gen).to(dev)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize(dev)
    return [_host(p) for p in model.parameters()]


def _backend_worker(backend, q):
    """Rank 0 of 1 on GPU 0 with ``backend``: the collectives, then DDP."""
    try:
        import torch.distributed as dist

        import commrt  # noqa: F401  (registers the "commrt" backend)
        from commrt.kernels._triton import interpret_mode

        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        dist.init_process_group(backend)
        got = _collectives(dev)
        got["ddp"] = _ddp(dev)
        got["group"] = type(dist.group.WORLD).__name__
        got["compiled"] = not interpret_mode()
        dist.destroy_process_group()
        q.put(("result", got))
    except Exception as e:  # reported to the test process
        q.put(("result", repr(e)))


def _run(backend) -> dict:
    env = dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, MASTER_ADDR="127.0.0.1")
    got = spawn([(_backend_worker, (backend,))], MASTER_PORT=_port(), **env)["result"]
    assert isinstance(got, dict), f"{backend}: {got}"
    return got


def test_ddp_on_commrt_matches_nccl_on_one_gpu():
    mine, ref = _run("commrt"), _run("nccl")
    assert mine["compiled"] and mine["group"] == "ProcessGroupCommrt", mine["group"]
    names = [k for k in ref if k.startswith(("all_", "reduce_"))]
    assert len(names) == 12
    unequal = [k for k in names if not np.array_equal(mine[k], ref[k])]
    assert not unequal, unequal
    for k in names:  # one rank: every collective hands back its input
        assert np.array_equal(mine[k], mine[f"input {k.split()[-1]}"]), k
    err = max(float(np.abs(a - b).max()) for a, b in zip(mine["ddp"], ref["ddp"]))
    assert err <= 1e-6, f"DDP over commrt differs from DDP over NCCL by {err}"


#: DDP on CUDA tensors with every way of seeing commrt switched on; the rank's stats
#: go to <folder>/<rank>.json
OBSERVED = """
import json, os, sys, torch, torch.distributed as dist
import commrt
rank = int(os.environ["RANK"])
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
dist.init_process_group("commrt")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=0.002)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(4):
    ddp(torch.randn(8, 32, device=dev)).sum().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize(dev)
s = commrt.distributed.stats()
rows = [dict(op=e.op, nbytes=e.nbytes, calls=e.calls, algorithm=e.algorithm)
        for e in s.entries.values()]
with open(os.path.join(sys.argv[1], f"{rank}.json"), "w") as f:
    json.dump(dict(rows=rows, transports=s.transports, text=str(s)), f)
dist.destroy_process_group()
"""


def test_ddp_on_cuda_shows_in_stats_log_and_trace(tmp_path):
    world = min(2, torch.cuda.device_count())
    script = tmp_path / "train.py"
    script.write_text(OBSERVED)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world)]
    cmd += ["--master-port", str(_port()), str(script), str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMRT_", "TRITON_"))}
    env.update(COMMRT_LOG="info", COMMRT_TRACE=str(tmp_path / "trace"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    buckets = (2600, 8448)  # DDP's buckets after its first step (tests/torch_distributed)
    for rank in range(world):
        stats = json.loads((tmp_path / f"{rank}.json").read_text())
        assert stats["transports"] == ["nccl"], stats["text"]
        seen = {r["nbytes"]: r for r in stats["rows"] if r["op"] == "allreduce(sum)"}
        assert set(buckets) <= set(seen), stats["text"]
        assert all(seen[n]["calls"] == 3 for n in buckets), stats["text"]
        if world > 1:
            assert all(seen[n]["algorithm"].startswith("auto:") for n in buckets)
        events = json.loads((tmp_path / "trace" / f"rank{rank}.json").read_text())
        sizes = {
            e["args"]["bytes"]
            for e in events["traceEvents"]
            if e["name"] == "commrt/allreduce(sum)"
        }
        assert set(buckets) <= sizes
    for nbytes in buckets:
        head = f"commrt: allreduce(sum) of {nbytes} B float32 on {world} ranks"
        said = [line for line in proc.stderr.splitlines() if line.startswith(head)]
        assert len(said) == 1, proc.stderr[-3000:]
        assert (": auto:" in said[0]) == (world > 1), said[0]
