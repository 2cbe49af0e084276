"""Ranks that count what the ``cuda_ipc`` transport waits on per all-reduce, on the strict
CPU stand-in device (tests/multiprocess/test_cuda_ipc_counts.py).

    ipc_count_worker.py OUTDIR ALGORITHMS SIZES
    ipc_count_worker.py OUTDIR order
    ipc_count_worker.py OUTDIR order_host
    ipc_count_worker.py death OUTDIR

ALGORITHMS and SIZES (bytes) are comma-separated; ``model`` is ``auto`` without learning
(``Auto(learn=False)``: the cost model's choice, which no timing can change). For each
algorithm, size and dtype
(fp32, bf16) a rank runs the all-reduce :data:`WARM` times, then once counted
(:func:`commrt.testing.counted`): a call in the steady state, past the first call's
agreement and, with ``auto``, once it settled. Every rank writes OUTDIR/rank<r>.json: per case, the
cross-process waits per peer, launches, host waits for the stream, the error against a
float64 sum of the same inputs, and a hash of the result's bytes (every rank must get
the same bits).

``order``: the one-shot workspace's three rules, each removed in turn (replaced on the
objects) while rank 1's stream runs 0.2 s behind its host: the wait on each peer's
counter, the counter raised by the stream (not the host) once the copy ran, and the two
halves by parity; the report says, per case, whether every call's result was exact.
``order_host``: the same for the one-shot summed on the host (the wait on each peer's
counter, the host's wait for its own copy in, the two halves).
``death``: after one one-shot call the last rank SIGKILLs itself; the others' next
one-shot call, waiting on its counter, must fail naming it (the abort hook ends the job).
None of this is a GPU result.
"""

import hashlib
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.engines import init_with  # noqa: E402
from helpers.ipc_standin import StandInDevice  # noqa: E402

import commrt  # noqa: E402
import commrt.transports.cuda_ipc_direct as direct  # noqa: E402
from commrt.algorithms import Auto  # noqa: E402
from commrt.algorithms.auto import candidates, learning, status  # noqa: E402
from commrt.algorithms.auto_learn import calls_to_settle  # noqa: E402
from commrt.testing import counted  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
#: calls before the counted one
WARM = 3
#: with ``auto``, at most this many more calls while it learns (it settles within
#: calls_to_settle of its candidates; the counted call is one of the steady state)
AUTO_CALLS = calls_to_settle(len(candidates(4, fused=True))) + 10


def _inputs(p, n, dtype):
    return [torch.randn(n, generator=torch.Generator().manual_seed(r)).to(dtype)
            for r in range(p)]  # fmt: skip


def case(comm, name, algorithm, nbytes, dtype) -> dict:
    n = max(1, nbytes // dtype.itemsize)
    xs = _inputs(comm.world_size, n, dtype)
    want = torch.stack([x.double() for x in xs]).sum(0)
    for _ in range(WARM):
        t = xs[comm.rank].clone()
        commrt.all_reduce(t, comm, algorithm=algorithm, op="sum")
    nbytes = n * dtype.itemsize
    for _ in range(AUTO_CALLS if algorithm == "auto" else 0):  # until auto settles
        if learning(comm)[nbytes].phase == "settled":
            break
        commrt.all_reduce(xs[comm.rank].clone(), comm, algorithm=algorithm, op="sum")
    t = xs[comm.rank].clone()
    with counted(comm) as counts:
        commrt.all_reduce(t, comm, algorithm=algorithm, op="sum")
    peers = [q for q in range(comm.world_size) if q != comm.rank]
    return {
        "waits": [counts.peer_waits[q] for q in peers],
        "launches": counts.launches,
        "stream_waits": counts.stream_waits,
        "err": ((t.double() - want).abs().max() / want.abs().max()).item(),
        "sha": hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest(),
        "runs": status(comm, nbytes)[0] if name in ("auto", "model") else name,
    }


def main(outdir, algorithms, sizes):
    comm = init_with("cuda_ipc", StandInDevice(seed=RANK), timeout=120, stall_s=0,
                     abort_on_error=False)  # fmt: skip
    report = {}
    for name in algorithms.split(","):
        algorithm = Auto(learn=False) if name == "model" else name
        for nbytes in map(int, sizes.split(",")):
            for dtype in (torch.float32, torch.bfloat16):
                key = f"{name} {nbytes} {str(dtype).split('.')[1]}"
                report[key] = case(comm, name, algorithm, nbytes, dtype)
    report["ran on"] = f"{comm.transport.name} {comm.device.type}"
    comm.close()
    with open(os.path.join(outdir, f"rank{RANK}.json"), "w") as f:
        json.dump(report, f)


#: each rule of the workspace, and how a case removes it (on the workspace, the device)
RULES = {
    "wait": lambda ws, dev: setattr(ws, "_posted", lambda peer, value, deadline: True),
    "posted by the stream": lambda ws, dev: setattr(dev, "host_func", lambda stream, fn: fn()),
    "two halves": lambda ws, dev: setattr(ws, "offset", lambda r: 0),
}


def _exact_calls(comm, salt) -> bool:
    """Four one-shot calls of three rounds each (halves of 4 KiB), integer-valued data
    that differs per call: whether every result is the exact sum."""
    ok, p = True, comm.world_size
    for call in range(4):
        mine = torch.arange(3000, dtype=torch.float32) + 1000 * (salt * 4 + call) + comm.rank
        want = p * (torch.arange(3000, dtype=torch.float32) + 1000 * (salt * 4 + call))
        want += sum(range(p))
        t = mine.clone()
        commrt.all_reduce(t, comm, algorithm="one_shot", op="sum")
        ok = ok and torch.equal(t, want)
    return ok


#: the same for the one-shot summed on the host (commrt.transports.cuda_ipc_host)
HOST_RULES = {
    "wait": lambda ws, dev: setattr(ws, "_posted", lambda peer, value, deadline: True),
    "copy waited for": lambda ws, dev: setattr(ws, "_copied", lambda deadline: True),
    "two halves": lambda ws, dev: setattr(ws, "parity", lambda r: 0),
}


def _slow_reader(ws) -> None:
    """Make this rank sum 50 ms after its peers' counters let it (a host that is late
    between its wait and its sum, where a peer's next call may already write)."""
    wait = type(ws)._posted.__get__(ws)

    def posted(peer, value, deadline):
        ok = wait(peer, value, deadline)
        time.sleep(0.05)
        return ok

    ws._posted = posted


def order(outdir, on_host=False):
    """The rules of the device workspace (halves of 4 KiB, three rounds a call), or with
    ``on_host`` those of the host's (every call summed there, one round a call)."""
    direct.HALF_BYTES = 4096
    os.environ["COMMRT_CUDA_IPC_HOST_BYTES"] = str(1 << 20 if on_host else 0)
    dev = StandInDevice(seed=RANK)
    comm = init_with("cuda_ipc", dev, timeout=60, stall_s=0, abort_on_error=False)
    _exact_calls(comm, 0)  # the workspace made, at the stand-in's usual latency
    tr, report = comm.transport, {}
    ws, rules = (tr.host_workspace, HOST_RULES) if on_host else (tr.workspace, RULES)
    for salt, (rule, remove) in enumerate(rules.items(), start=1):
        for removed in (False, True):
            dev.latency_s = 0.2 if RANK == 1 else 0.002
            if on_host and RANK == 1:
                _slow_reader(ws)
            if removed:
                remove(ws, dev)
            report[f"{rule} {'removed' if removed else 'kept'}"] = _exact_calls(comm, salt)
            for name in ("_posted", "offset", "_copied", "parity"):
                ws.__dict__.pop(name, None)  # the class's own rule again
            dev.__dict__.pop("host_func", None)
            dev.latency_s = 0.002
            comm.barrier()
    comm.close()
    with open(os.path.join(outdir, f"rank{RANK}.json"), "w") as f:
        json.dump(report, f)


def death(outdir):
    import signal

    comm = init_with("cuda_ipc", StandInDevice(seed=RANK), timeout=120, stall_s=0)
    t = torch.ones(1000)
    commrt.all_reduce(t, comm, algorithm="one_shot")
    if comm.rank == comm.world_size - 1:
        with open(os.path.join(outdir, "killed"), "w") as f:
            f.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    commrt.all_reduce(t, comm, algorithm="one_shot")


if __name__ == "__main__":
    if sys.argv[1] == "death":
        death(sys.argv[2])
    elif sys.argv[2] in ("order", "order_host"):
        order(sys.argv[1], on_host=sys.argv[2] == "order_host")
    else:
        main(*sys.argv[1:])
