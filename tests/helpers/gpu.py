"""Spawned GPU workers, shared by the GPU tests and the NCCL rule tests."""

import contextlib
import os
import queue as queue_mod
import time

import torch.multiprocessing as mp

#: seconds a GPU worker may take before it is killed
WORKER_TIMEOUT_S = 300


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
