"""Spawned GPU workers, shared by the GPU tests and the NCCL rule tests."""

import contextlib
import os
import queue as queue_mod
import time

import pytest
import torch
import torch.multiprocessing as mp

#: seconds a GPU worker may take before it is killed
WORKER_TIMEOUT_S = 90
#: seconds a job of several ranks on the one GPU may take before its ranks are dumped
#: (their stacks) and killed: well inside the GPU check's test step, so a hang leaves
#: time, and its evidence, for the rest of the check and a second run in the same lease
RANKS_LIMIT_S = 90


@contextlib.contextmanager
def gpu_env(**extra):
    """The environment a spawned GPU worker starts with: no TRITON_INTERPRET (conftest's),
    plus ``extra``; restored afterwards."""
    saved = dict(os.environ)
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.update({k: str(v) for k, v in extra.items()})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def spawn(targets, timeout=WORKER_TIMEOUT_S, **env) -> dict:
    """Run ``target(*args, queue)`` for each (target, args) in spawned processes; return
    {key: value} from what they put on the queue. Workers still alive at ``timeout`` are
    killed and the test fails."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with gpu_env(**env):
        procs = [ctx.Process(target=t, args=(*a, q)) for t, a in targets]
        for p in procs:
            p.start()
    deadline, results = time.monotonic() + timeout, {}
    try:
        for _ in procs:
            results.update([q.get(timeout=max(1.0, deadline - time.monotonic()))])
    except queue_mod.Empty:
        pass
    finally:
        for p in procs:
            p.join(max(1.0, min(30.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                results.setdefault("killed", []).append(p.pid)
    assert "killed" not in results, f"hung GPU workers killed: {results}"
    return results


#: the marks of a test that needs a GPU (tools/gpu_check.py reports it NOT RUN when skipped)
GPU_ONLY = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]

#: ranks of tests/workers/ipc_worker.py on the real device, compiled Triton, default slots
ON_GPU = {"IPC_ON_GPU": "1", "COMMRT_CUDA_IPC_SLOT_BYTES": str(4 << 20)}
#: conftest's TRITON_INTERPRET, which GPU ranks must not inherit
NO_INTERPRETER = ["TRITON_INTERPRET"]


def gpu_ranks(out, n: int, mode: str, timeout: float = RANKS_LIMIT_S) -> list[dict]:
    """Run ``n`` ranks of ``ipc_worker.py MODE`` on the one GPU; every rank's report, after
    checking that every rank exited 0.

    NCCL refuses two ranks on one device, so the ranks run through commrt's own
    ``cuda_ipc`` (processes time-sharing the GPU, device memory exchanged by CUDA IPC).
    The same worker runs on the CPU with the strict stand-in device in
    tests/multiprocess/test_cuda_ipc.py; only runs here say anything of a GPU.
    tools/gpu_check.py runs the files of tests/gpu/ at once, so the multi-rank checks
    are three files (test_gpu_ranks*.py) that share the GPU."""
    import json

    from helpers.mp import gloo_ranks

    codes, outs = gloo_ranks(n, "ipc_worker.py", mode, out, timeout=timeout, env=ON_GPU,
                             drop_env=NO_INTERPRETER)  # fmt: skip
    assert codes == [0] * n, "\n---\n".join(o[-3000:] for o in outs)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def check_gradsync(report: dict) -> None:
    """ipc_worker.py gradsync's report: ring, torus2d and gossip, fp32 and a bf16 wire,
    agree across ranks and with float64 (ring, torus2d); bucket 0's communication overlaps
    backward."""
    for wire, tol in (("float32", 1e-5), ("bfloat16", 2e-2)):
        for name in ("ring", "torus2d", "gossip"):
            got = report[f"{name} {wire}"]
            assert isinstance(got, dict) and got["vs rank 0"] == 0.0, (name, wire, got)
            assert got.get("vs float64", 0.0) < tol, (name, wire, got)
        assert report[f"overlap ring {wire}"] is True, report


def check_deadline(report: dict) -> None:
    """ipc_worker.py gradsync's gossip with a deadline, its ranks late in turn: the ranks
    agree after averaging, some messages were late, none lost, and over every rank what
    was computed is what was applied plus what was held at close."""
    got = report["gossip deadline float32"]
    assert isinstance(got, dict) and got["vs rank 0"] == 0.0, got
    assert got["late"] > 0 and got["lost"] == 0 and got["accounting"] < 1e-6, got
