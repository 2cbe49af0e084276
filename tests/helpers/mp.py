"""Launch helpers for multi-process tests."""

import os
import shutil
import signal
import subprocess
import time

from commrt import settings
from helpers import zygote

#: the tests/ folder (workers live in tests/workers)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: environment variable: a folder where every rank job's outputs are saved
LOGS_ENV = "COMMRT_TEST_LOGS"
#: seconds a hung rank gets to print its stacks (SIGABRT) before it is killed
DUMP_S = 5


def _worker(script: str) -> str:
    return os.path.join(TESTS, "workers", script)


def mpiexec(
    n: int, script: str, *args, timeout: float = 300, check: bool = True, env=None, flags=()
):
    """Run ``tests/workers/<script>`` on ``n`` MPI ranks; return the CompletedProcess.
    ``env``: variables added to this process's environment for the ranks; ``flags``:
    mpiexec's own (``-prepend-rank``). Each rank is forked from the zygote
    (:mod:`helpers.zygote`)."""
    exe = shutil.which("mpiexec")
    assert exe, (
        "mpiexec not found: install the dev extras (pip install -e '.[dev]' brings the mpich wheel)"
    )
    cmd = [exe, *flags, "-n", str(n), *zygote.command(_worker(script), *args)]
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
    job = GlooJob(script, args, n, drop_env, env)
    for r in range(n):
        job.start(r)
    return job.finish(timeout)


class GlooJob:
    """Ranks of ``tests/workers/<script>`` with torchrun's variables and a store hosted
    here (so that any rank may die, and a replacement may be started under its rank).

    ``rank0_hosts``: launched as a user launches from the environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; no launcher, no agent): rank 0
    hosts the store, and whatever it takes with it when it ends, the test sees. Each rank
    is forked from the zygote (:mod:`helpers.zygote`)."""

    def __init__(self, script: str, args, n: int, drop_env=(), env=None, rank0_hosts=False):
        from commrt.runtime.store import host_store

        self.store = None if rank0_hosts else host_store()
        self.env = dict(
            os.environ,
            WORLD_SIZE=str(n),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port() if rank0_hosts else self.store.port),
            PYTHONUNBUFFERED="1",
            PYTHONFAULTHANDLER="1",  # a hung rank's stacks, on the SIGABRT of finish()
            OMP_NUM_THREADS="1",
        )
        if not rank0_hosts:
            self.env["TORCHELASTIC_USE_AGENT_STORE"] = "true"
        self.env.update(env or {})  # the caller's variables win over torchrun's
        agent = () if not rank0_hosts else ("TORCHELASTIC_USE_AGENT_STORE",)
        for name in (settings.STORE.name, *agent, *drop_env):
            self.env.pop(name, None)
        self.script, self.args = script, [str(a) for a in args]
        self.cmd = zygote.command(_worker(script), *args)
        self.procs: list[subprocess.Popen] = []

    def start(self, rank: int, **env) -> subprocess.Popen:
        """Start a process as ``rank`` (``env``: variables changed for it; None drops one)."""
        run_env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(rank), **env)
        run_env = {k: v for k, v in run_env.items() if v is not None}
        proc = subprocess.Popen(
            self.cmd, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.procs.append(proc)
        return proc

    def finish(self, timeout: float):
        """Wait for every process started until ``timeout``; return (exit codes, outputs)
        in the order they were started.

        A process still running then is hung: it gets SIGABRT, on which Python's
        faulthandler (on in every rank) prints each thread's stack, and SIGKILL
        :data:`DUMP_S` later; its code is negative and its output ends in those stacks,
        for the test's failure to show. Each rank's output is also saved under
        ``$COMMRT_TEST_LOGS`` where that is set (the GPU check sets it under ``$OUT``,
        the one folder the lent machine gives back)."""
        outs, deadline = {}, time.monotonic() + timeout
        for i, p in enumerate(self.procs):
            try:
                outs[i] = p.communicate(timeout=max(1, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                break
        hung = [p for p in self.procs if p.poll() is None]
        for p in hung:
            p.send_signal(signal.SIGABRT)
        for i, p in enumerate(self.procs):
            if i not in outs:
                try:
                    outs[i] = p.communicate(timeout=DUMP_S)[0]
                except subprocess.TimeoutExpired:  # stopped, or stuck where no signal lands
                    p.kill()
                    outs[i] = p.communicate()[0]
        said = [outs[i] or "" for i in range(len(self.procs))]
        self._save(said, hung)
        return [p.returncode for p in self.procs], said

    def _save(self, outs: list[str], hung: list) -> None:
        folder = os.environ.get(LOGS_ENV)
        if not folder:
            return
        os.makedirs(folder, exist_ok=True)
        stem = f"{os.path.splitext(self.script)[0]}-{time.strftime('%H%M%S')}"
        for r, (p, out) in enumerate(zip(self.procs, outs)):
            note = " (hung: SIGABRT, stacks at the end)" if p in hung else ""
            with open(os.path.join(folder, f"{stem}-rank{r}.txt"), "w") as f:
                f.write(
                    f"# {' '.join([self.script, *self.args])}: exit {p.returncode}{note}\n{out}"
                )


def free_port() -> int:
    """A TCP port free on the loopback address now (for rank 0 to listen on)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def die_after_one_all_reduce(comm, out: str) -> None:
    """(In a worker.) One all-reduce; then the last rank SIGKILLs itself, writing the time to
    ``out``/killed, and the others' next all-reduce fails (the abort hook ends the job)."""
    import signal

    import torch

    import commrt

    t = torch.ones(1000)
    commrt.all_reduce(t, comm)
    if comm.rank == comm.world_size - 1:
        with open(os.path.join(out, "killed"), "w") as f:
            f.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    commrt.all_reduce(t, comm)


def killed_peer_said(n: int, script: str, out, within_s: float, timeout: float = 150) -> str:
    """Run ``n`` ranks of ``script death out`` (:func:`die_after_one_all_reduce`); check
    that the last was killed and the others ended within ``within_s`` seconds of it, with
    an error. Returns what the ranks said."""
    codes, outs = gloo_ranks(n, script, "death", out, timeout=timeout)
    ended = time.time()
    assert codes[-1] == -9, outs[-1]
    assert all(c != 0 for c in codes[:-1]), "\n---\n".join(outs)
    killed = float((out / "killed").read_text())
    assert ended - killed < within_s, "\n---\n".join(outs)
    return "".join(outs)
