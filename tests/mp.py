"""Launch helpers for multi-process tests."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def mpiexec(n: int, script: str, *args, timeout: float = 300, check: bool = True):
    """Run ``tests/workers/<script>`` on ``n`` MPI ranks; return the CompletedProcess."""
    exe = shutil.which("mpiexec")
    assert exe, "mpiexec not found: install the dev extras (pip install -e '.[dev]' brings the mpich wheel)"
    cmd = [exe, "-n", str(n), sys.executable, os.path.join(HERE, "workers", script), *map(str, args)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-4000:]}")
    return proc
