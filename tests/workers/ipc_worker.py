"""Ranks over the ``cuda_ipc`` transport with the strict CPU stand-in device, torchrun-style
(tests/multiprocess/test_cuda_ipc.py, test_cuda_ipc_order.py).

    ipc_worker.py MODE OUTDIR

Every rank writes OUTDIR/rank<r>.json. Modes:

* ``collectives``: all_reduce with ring, halving-doubling, torus2d, one-shot and two-shot, reduce_scatter
  and all_gather, fp32 and fp64, sizes that span many slots, each against a float64
  reference; results (max error per case) in the report.
* ``order``: rank 0 sends rank 1 numbered messages of many pieces; each of the four
  waits of the protocol is removed in turn (replaced on the transport object) under
  stream latencies that make the race happen; the report says, per case, whether every
  message arrived intact.
* ``sequence``: many messages of mixed sizes (empty ones, one piece, many pieces) in
  both directions over several exchanges: each arrives in the order it was issued.
* ``mismatch``: rank 0 sends 400 bytes where rank 1 posted 800: a named error.
* ``death``: after one all-reduce the last rank SIGKILLs itself; the others' next
  all-reduce must fail naming it (the abort hook ends the job).
* ``timeout``: rank 1 stays away for longer than the 3 s timeout: rank 0's all-reduce is
  a CommTimeoutError, and the transport is unusable afterwards, by name.
* ``refuse``: "GPUs" without peer access: init refuses on every rank alike.
* ``close_waits``, ``close_leaves``: rank 1 closes late; rank 0's close waits for it
  before it frees its slab, or (past the bound) frees nothing.
"""

import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.engines import init_with  # noqa: E402
from helpers.ipc_standin import StandInDevice  # noqa: E402
from helpers.mp import die_after_one_all_reduce  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import (  # noqa: E402
    BackupWorkers,
    Gossip,
    HalvingDoubling,
    OneShot,
    Ring,
    Torus2D,
    TwoShot,
)

RANK = int(os.environ.get("RANK", "0"))
#: 4 slots of 4 KiB per link: every message over 16 KiB reuses slots
os.environ.setdefault("COMMRT_CUDA_IPC_SLOT_BYTES", "4096")


#: set (by tests/gpu/test_gpu_ranks.py): the real CUDA device, every rank on one GPU
ON_GPU = os.environ.get("IPC_ON_GPU") == "1"
#: on the GPU, a wait's timeout and the stall watch (seconds), within the rank job's limit
#: (helpers.gpu.RANKS_LIMIT_S): a hang there prints the verdict and raises, naming the
#: rank and its line, before the job is killed; the stand-in's waits keep theirs
GPU_TIMEOUT_S, GPU_STALL_S = 60, 20


def init(latency_s=0.002, timeout=120, **kw):
    """A cuda_ipc communicator on the stand-in device, or on the GPU under ``IPC_ON_GPU``."""
    dev = None if ON_GPU else StandInDevice(latency_s=latency_s, seed=RANK, **kw)
    timeout, stall_s = (min(timeout, GPU_TIMEOUT_S), GPU_STALL_S) if ON_GPU else (timeout, 0)
    comm = init_with("cuda_ipc", dev, timeout=timeout, stall_s=stall_s,
                       abort_on_error=False)  # fmt: skip
    return comm, dev


def collectives(out):
    comm, _ = init()
    p, report = comm.world_size, {}
    algos = {"ring": Ring(), "hd": HalvingDoubling(), "one_shot": OneShot(), "two_shot": TwoShot()}
    algos["torus2d"] = Torus2D(rows=2, cols=p // 2) if p % 2 == 0 else Torus2D()
    for dtype in (torch.float32, torch.float64):
        for n in (1, 1000, 30011):
            full = [torch.randn(n, generator=torch.Generator().manual_seed(r), dtype=torch.float64)
                    for r in range(p)]  # fmt: skip
            ref = sum(full)
            for name, alg in algos.items():
                t = full[comm.rank].to(comm.device, dtype, copy=True)
                commrt.all_reduce(t, comm, algorithm=alg, op="sum")
                report[f"all_reduce {name} {dtype} {n}"] = _err(t, ref)
            m = n * p
            whole = [torch.randn(m, generator=torch.Generator().manual_seed(9 + r),
                                 dtype=torch.float64) for r in range(p)]  # fmt: skip
            shard = torch.empty(n, dtype=dtype, device=comm.device)
            commrt.reduce_scatter(shard, whole[comm.rank].to(comm.device, dtype, copy=True), comm)
            want = sum(whole)[comm.rank * n : (comm.rank + 1) * n]
            report[f"reduce_scatter {dtype} {n}"] = _err(shard, want)
            gathered = torch.empty(m, dtype=dtype, device=comm.device)
            commrt.all_gather(gathered, full[comm.rank].to(comm.device, dtype, copy=True), comm)
            report[f"all_gather {dtype} {n}"] = _err(gathered, torch.cat(full).to(dtype).double())
    report["ran on"] = f"{comm.transport.name} {comm.device.type}"
    comm.close()
    return report


def _err(t, ref) -> float:
    return (t.double().cpu() - ref).abs().max().item()


STEPS = 3
#: gossip's deadline (seconds), and how long a rank is away on its late steps (every
#: other step, alternating between ranks): its partners go on without its message, which
#: lands and is applied at a later step (or held at close)
DEADLINE_S, LATE_S = 0.05, 0.3


class _Slow(torch.autograd.Function):
    """Identity whose backward sleeps: backward lasts long enough to overlap."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.1)
        return grad


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.mid, self.last = (
            torch.nn.Linear(32, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 4)
        )  # fmt: skip

    def forward(self, x):
        return self.last(torch.relu(self.mid(_Slow.apply(torch.relu(self.first(x))))))


def _batch(step, rank, device):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g).to(device), torch.randn(16, 4, generator=g).to(device)


def _reference(p) -> torch.Tensor:
    """SGD on the average of every rank's gradient, in float64 on the CPU."""
    model = _Net().double()
    for s in range(STEPS):
        grads = []
        for r in range(p):
            model.zero_grad()
            x, y = _batch(s, r, "cpu")
            torch.nn.functional.mse_loss(model(x.double()), y.double()).backward()
            grads.append([q.grad.clone() for q in model.parameters()])
        with torch.no_grad():
            for i, q in enumerate(model.parameters()):
                q -= 0.1 * sum(g[i] for g in grads) / p
    return torch.cat([q.detach().reshape(-1) for q in model.parameters()])


def _overlapped(tracer) -> bool:
    """Whether bucket 0's communication ended before backward did, in every step but the
    first (whose compute also counts the set-up)."""
    ev = [e for e in tracer.to_chrome()["traceEvents"] if e["ph"] == "X"]
    back = [e for e in ev if e["name"] == "commrt/backward"]
    comm0 = [e for e in ev if e["name"] == "commrt/bucket0/comm"]
    pairs = list(zip(back, comm0))[1:]
    return bool(pairs) and all(c["ts"] + c["dur"] < b["ts"] + b["dur"] for b, c in pairs)


def _algorithms(p):
    return {
        "ring": Ring(),
        "torus2d": Torus2D(rows=2, cols=p // 2) if p % 2 == 0 else Torus2D(),
        "gossip": Gossip(),
        "gossip deadline": Gossip(deadline_s=DEADLINE_S),
        "backup": BackupWorkers(backups=1),
    }


def _train(comm, alg, wire, trace):
    model = _Net().to(comm.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = commrt.GradientSync(model, comm, algorithm=alg, bucket_mb=0.1, first_bucket_mb=0.01,
                               comm_dtype=wire, trace=trace)  # fmt: skip
    late = getattr(alg, "deadline_s", None) is not None
    for s in range(STEPS):
        if late and (s + comm.rank) % 2:
            time.sleep(LATE_S)
        x, y = _batch(s, comm.rank, comm.device)
        torch.nn.functional.mse_loss(model(x), y).backward()
        sync.step(opt)
    overlapped = _overlapped(sync.tracer) if trace else None
    sync.close()
    return model, overlapped, _account(comm, sync.policy.ledger) if late else None


def _account(comm, ledger) -> dict:
    """Gossip with a deadline's ledger over every rank: what was computed against what
    was applied plus what was held at close (relative), and how many messages were late."""
    sums = torch.tensor([ledger.computed, ledger.applied, ledger.unapplied, ledger.late,
                         ledger.lost + ledger.lost_sends], dtype=torch.float64,
                        device=comm.device)  # fmt: skip
    commrt.all_reduce(sums, comm)
    computed, applied, unapplied, late, lost = sums.tolist()
    return {"accounting": abs(computed - applied - unapplied) / abs(computed), "late": late,
            "lost": lost}  # fmt: skip


def gradsync(out):
    """GradientSync with every family, fp32 and a bf16 wire: the all-reduces against the
    float64 reference; gossip and backup workers: every rank agrees after averaging (gossip)
    or at once (backup, whose late rank catches up bit for bit)."""
    comm, _ = init(timeout=30)
    p, report, ref = comm.world_size, {}, _reference(comm.world_size)
    # gossip with a deadline and backup workers last: on a transport without tags a failure
    # there leaves it unusable, and what ran before stays shown
    cases = [(n, w) for w in (torch.float32, torch.bfloat16) for n in ("ring", "torus2d", "gossip")]
    cases += [(n, torch.float32) for n in ("gossip deadline", "backup")]
    for name, wire in cases:
        alg = _algorithms(p)[name]
        key = f"{name} {str(wire).split('.')[1]}"
        try:
            model, overlapped, account = _train(comm, alg, wire, trace=name == "ring")
            if name.startswith("gossip"):
                commrt.average_parameters(model, comm)
            flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
            zero = flat.clone()
            commrt.broadcast(zero, comm, root=0)
            report[key] = {"vs rank 0": (flat - zero).abs().max().item()}
            if name in ("ring", "torus2d"):
                report[key]["vs float64"] = _err(flat, ref) / ref.abs().max().item()
            if account is not None:
                report[key].update(account)
            if overlapped is not None:
                report[f"overlap {key}"] = overlapped
        except Exception as e:  # noqa: BLE001 (the report names it)
            report[key] = f"{type(e).__name__}: {e}"
    report["ran on"] = f"{comm.transport.name} {comm.device.type}"
    comm.close()
    return report


def _flat(model) -> torch.Tensor:
    full = [q.full_tensor() if hasattr(q, "full_tensor") else q for q in model.parameters()]
    return torch.cat([q.detach().double().cpu().reshape(-1) for q in full])


def _steps(model, rank, device) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(STEPS):
        x, y = _batch(s, rank, device)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def ddp(out):
    """(GPU only.) DDP, then FSDP2, on backend "commrt" with CUDA tensors of ranks that
    share one GPU: the group's CUDA transport must be cuda_ipc; both against float64."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import commrt.distributed  # noqa: F401  (registers the backend)

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("commrt")
    rank, p = dist.get_rank(), dist.get_world_size()
    ref, report = _reference(p), {}
    model = torch.nn.parallel.DistributedDataParallel(_Net().to(dev))
    _steps(model, rank, dev)
    report["ddp vs float64"] = (_flat(model) - ref).abs().max().item() / ref.abs().max().item()
    model = _Net().to(dev)
    mesh = init_device_mesh("cuda", (p,))
    for layer in (model.first, model.mid, model.last):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _steps(model, rank, dev)
    report["fsdp2 vs float64"] = (_flat(model) - ref).abs().max().item() / ref.abs().max().item()
    report["cuda transport"] = dist.group.WORLD.devices.get(dev).comm.backend.value
    dist.destroy_process_group()
    return report


def _send_numbered(comm, count, elems, salt, stay_away_s=0.0):
    """Rank 0 sends ``count`` numbered messages to rank 1 (``salt`` makes them differ from
    an earlier call's); whether all arrived intact (on rank 1; True on rank 0)."""
    tr = comm.transport
    deadline = time.monotonic() + 30
    msgs = [torch.arange(elems, dtype=torch.float32) + 1000.0 * (i + 1) + 1e5 * salt
            for i in range(count)]  # fmt: skip
    if comm.rank == 0:
        time.sleep(stay_away_s)
        pend = tr.exchange([(m, 1) for m in msgs], [], 0)
        ok = all(pend.wait_send(i, deadline) for i in range(count))
        return ok and tr.sync(deadline)
    got = [torch.zeros(elems) for _ in range(count)]
    pend = tr.exchange([], [(g, 0) for g in got], 0)
    ok = all(pend.wait_recv(i, deadline) for i in range(count)) and tr.sync(deadline)
    return ok and all(torch.equal(g, m) for g, m in zip(got, msgs))


#: each removed wait, and the stream latencies (rank 0's, rank 1's) and delay of the
#: sender that let its race happen
CASES = {
    "wait_ready": ((0.2, 0.0), 0.0),  # the sender's stream lags behind its host
    "can_write": ((0.0, 0.2), 0.0),  # the receiver's stream lags: slots reused too soon
    "wait_consumed": ((0.0, 0.2), 0.0),
    # the receiver's host runs ahead of the sender's (last: it may break the transport)
    "can_read": ((0.002, 0.002), 0.3),
}


def _without(tr, wait: str) -> None:
    """Remove one wait of the protocol from this transport object."""
    if wait.startswith("can_"):
        setattr(tr, wait, lambda link, n: True)
    else:
        setattr(tr, wait, lambda link, slot: None)


def order(out):
    comm, dev = init()
    report, salt = {}, 0
    for wait, (latency, stay_away) in CASES.items():
        for removed in (False, True):
            dev.latency_s, salt = latency[comm.rank], salt + 1
            if removed:
                _without(comm.transport, wait)
            try:  # 6 messages of 4 pieces through 4 slots
                ok = _send_numbered(comm, 6, 4096, salt, stay_away)
            except RuntimeError as e:
                ok = f"{type(e).__name__}: {e}"
            report[f"{wait} {'removed' if removed else 'kept'}"] = ok
            for name in ("can_read", "wait_ready", "can_write", "wait_consumed"):
                comm.transport.__dict__.pop(name, None)  # the class's own wait again
            dev.latency_s = 0.002
            if comm.transport.broken is None:
                comm.barrier()
    comm.close()
    return report


def sequence(out):
    comm, _ = init(latency_s=0.001)
    tr, peer, report = comm.transport, 1 - comm.rank, {}
    sizes = [0, 1, 5, 1024, 1025, 4096, 12000, 0, 3, 40000, 7, 0]
    deadline = time.monotonic() + 60
    for round_ in range(3):
        mine = [torch.full((n,), float(comm.rank * 100000 + round_ * 1000 + i))
                for i, n in enumerate(sizes)]  # fmt: skip
        theirs = [torch.empty(n) for n in sizes]
        pends = [tr.exchange([(m, peer)], [(t, peer)], 0) for m, t in zip(mine, theirs)]
        for pend in reversed(pends):  # waited in the other order: matching is by issue order
            assert pend.wait_recv(0, deadline) and pend.wait_send(0, deadline)
        assert tr.sync(deadline)
        want = [float(peer * 100000 + round_ * 1000 + i) for i in range(len(sizes))]
        report[f"round {round_}"] = all(bool((t == w).all()) for t, w in zip(theirs, want))
    report["pieces"] = [tr.out[peer].next, tr.inb[peer].next]
    comm.close()
    return report


def mismatch(out):
    comm, _ = init()
    tr, deadline = comm.transport, time.monotonic() + 20
    try:
        if comm.rank == 0:
            pend = tr.exchange([(torch.zeros(100), 1)], [], 0)
            pend.wait_send(0, deadline)
            tr.sync(deadline)
            time.sleep(2)
        else:
            pend = tr.exchange([], [(torch.zeros(200), 0)], 0)
            pend.wait_recv(0, deadline)
    except Exception as e:  # noqa: BLE001 (the report names it)
        return {"error": f"{type(e).__name__}: {e}"}
    return {"error": None}


def death(out):
    dev = StandInDevice(seed=RANK)
    comm = init_with("cuda_ipc", dev, timeout=120, stall_s=0)
    die_after_one_all_reduce(comm, out)


def timeout(out):
    dev = StandInDevice(seed=RANK)
    comm = init_with("cuda_ipc", dev, timeout=3, stall_s=0, abort_on_error=False)
    report = {}
    if comm.rank == 1:
        time.sleep(8)
        return report
    for key in ("first", "second"):
        start = time.monotonic()
        try:
            commrt.all_reduce(torch.ones(100), comm)
            report[key] = None
        except Exception as e:  # noqa: BLE001 (the report names it)
            report[key] = f"{type(e).__name__}: {e}"
        report[key + "_s"] = time.monotonic() - start
    return report


def _closing(late_s: float, close_s: float | None = None) -> dict:
    """Rank 1 closes ``late_s`` after rank 0; rank 0's close: how long, and whether it
    freed its slab (``close_s``: the transport's bound on waiting for the peers)."""
    import commrt.transports.cuda_ipc as ipc

    if close_s is not None:
        ipc.CLOSE_S = close_s
    dev = StandInDevice(seed=RANK)
    freed = []
    free = dev.free
    dev.free = lambda ptr: (freed.append(ptr), free(ptr))[1]
    comm = init_with("cuda_ipc", dev, timeout=30, stall_s=0)
    commrt.all_reduce(torch.ones(10), comm)
    if comm.rank == 1:
        time.sleep(late_s)
    start = time.monotonic()
    comm.close()
    return {"close_s": time.monotonic() - start, "freed": bool(freed)}


def close_waits(out):
    """A close waits for the peer's stream to have run (its close) before it frees."""
    return _closing(late_s=1.5)


def close_leaves(out):
    """A peer alive that does not close within the bound: nothing is freed."""
    return _closing(late_s=4.0, close_s=1.0)


def refuse(out):
    dev = StandInDevice(seed=RANK, name=f"gpu{RANK}", peer_access=False)
    try:
        init_with("cuda_ipc", dev, timeout=30, stall_s=0)
    except ValueError as e:
        return {"init_error": str(e)}
    return {"init_error": None}


if __name__ == "__main__":
    mode, outdir = sys.argv[1], sys.argv[2]
    result = globals()[mode](outdir)
    with open(os.path.join(outdir, f"rank{RANK}.json"), "w") as f:
        json.dump(result, f)
