"""Launch helpers for multi-process tests."""

import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def mpiexec(n: int, script: str, *args, timeout: float = 300, check: bool = True, env=None):
    """Run ``tests/workers/<script>`` on ``n`` MPI ranks; return the CompletedProcess.
    ``env``: variables added to this process's environment for the ranks."""
    exe = shutil.which("mpiexec")
    assert exe, (
        "mpiexec not found: install the dev extras (pip install -e '.[dev]' brings the mpich wheel)"
    )
    cmd = [
        exe,
        "-n",
        str(n),
        sys.executable,
        os.path.join(HERE, "workers", script),
        *map(str, args),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def gloo_ranks(n: int, script: str, *args, timeout: float = 120, drop_env=(), env=None):
    """Run ``tests/workers/<script>`` as ``n`` gloo ranks with torchrun's variables, the
    store hosted here; return (exit codes, outputs). Ranks still running at ``timeout``
    are killed. ``env``: variables added for the ranks."""
    from commrt.store import STORE_ENV, host_store

    store = host_store()
    env = dict(
        os.environ,
        WORLD_SIZE=str(n),
        LOCAL_WORLD_SIZE=str(n),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port),
        TORCHELASTIC_USE_AGENT_STORE="true",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        **(env or {}),
    )
    for name in (STORE_ENV, *drop_env):
        env.pop(name, None)
    path = os.path.join(HERE, "workers", script)
    procs = [
        subprocess.Popen(
            [sys.executable, path, *map(str, args)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(n)
    ]
    outs, deadline = [], time.monotonic() + timeout
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], outs
