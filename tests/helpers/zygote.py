"""Test ranks forked from one interpreter that has already imported torch.

Why: every rank a test starts is a process, and its ``import torch`` costs about 2.5 s of
CPU (3.5 s on a slow machine of CI's kind); with two to eight ranks per job on 2 cores that
start-up was most of the multi-process tests' time. PyTorch's own distributed tests fork
their ranks for the same reason.

How: the first test that starts ranks starts one *zygote* per pytest process
(:func:`start`): ``python zygote.py serve SOCKET`` imports torch, then waits on a Unix
socket. A rank is launched as ``python -S zygote.py run WORKER ARGS...`` (see
:func:`command`), by ``subprocess`` or by ``mpiexec`` as before: that *shim* starts in
milliseconds, sends the zygote its argv, environment, folder and descriptors (0, 1, 2 and
MPI's ``PMI_FD``), and the zygote forks the rank with them. The shim stays the process the
test or ``mpiexec`` holds:

* it forwards every signal that can be caught to the rank, and exits as the rank did
  (the same code, or killed by the same signal);
* if it is SIGKILLed, the zygote sees its socket close and SIGKILLs the rank;
* if the zygote is gone, the shim SIGKILLs the rank and exits 1.

A rank differs from a fresh interpreter in what was decided when the zygote started, so the
zygote refuses (and the shim then ``exec``\\s a fresh ``python WORKER ARGS...`` in its own
place) where the rank's environment differs from the zygote's in a variable read at start-up
(:data:`AT_START`): ``PYTHON*`` (but ``PYTHONUNBUFFERED`` and ``PYTHONFAULTHANDLER``,
applied here per rank), OpenMP's and BLAS's thread counts, ``LD_*``. What stays different:
every forked rank has the zygote's string-hash seed, and ``numpy``'s global random state is
reseeded. A rank stopped from outside stays running (SIGSTOP cannot be forwarded), and a
rank is not in its shim's process tree: no test does either to a helper's ranks.
``TEST_FRESH_RANKS=1`` makes every rank a fresh interpreter, as before.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

#: environment variable: the zygote's socket, set in the pytest process for its ranks' shims
SOCKET_ENV = "TEST_RANK_ZYGOTE"
#: environment variable: "1" starts no zygote; every rank is a fresh interpreter
FRESH_ENV = "TEST_FRESH_RANKS"
#: variables applied per rank (the rest of the ``PYTHON*`` ones are read once, at start-up)
PER_RANK = ("PYTHONUNBUFFERED", "PYTHONFAULTHANDLER")
#: prefixes of the variables read when the interpreter, torch or OpenMP starts
AT_START = ("PYTHON", "OMP_", "OPENBLAS_", "MKL_", "KMP_", "GOMP_", "LD_", "TORCH_CPP_")
#: signals the shim forwards to its rank (SIGKILL and SIGSTOP cannot be caught)
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGABRT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGTSTP,
)
_INT = struct.Struct("!i")
#: the zygote's stderr, in the folder of its socket
LOG = "zygote.log"
#: a zygote's answer instead of a pid: it will not fork this rank (run it fresh)
REFUSED = -1


def command(script: str, *args) -> list[str]:
    """The argv that runs ``script args...`` as a rank: through the zygote where this
    process has one (:func:`start`), else as a fresh interpreter."""
    if os.environ.get(SOCKET_ENV):
        return [sys.executable, "-S", os.path.abspath(__file__), "run", script, *map(str, args)]
    return [sys.executable, script, *map(str, args)]


def start(folder: str):
    """Start this process's zygote with its socket in ``folder`` and point
    ``$TEST_RANK_ZYGOTE`` at it (for every rank started from here on); returns the
    zygote's ``Popen``, or None where ``$TEST_FRESH_RANKS`` is set."""
    import subprocess

    if os.environ.get(FRESH_ENV) == "1":
        return None
    path = os.path.join(folder, "zygote.sock")
    env = {k: v for k, v in os.environ.items() if k not in PER_RANK}
    env.setdefault("OMP_NUM_THREADS", "1")  # the thread count the tests' ranks run with
    with open(os.path.join(folder, LOG), "w") as err:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", path],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    # the zygote listens once torch is imported: ranks' shims wait for the socket
    os.environ[SOCKET_ENV] = path
    return proc


def stop(proc) -> None:
    """End a zygote that :func:`start` returned (its forked ranks are each their shim's).

    Raises RuntimeError, with the end of its log, where it had already ended: every rank
    started after that ran as a fresh interpreter, so the tests passed but paid for it."""
    os.environ.pop(SOCKET_ENV, None)
    if proc is None:
        return
    died = proc.poll()
    proc.terminate()
    proc.wait(10)
    if died is not None:
        with open(os.path.join(os.path.dirname(proc.args[-1]), LOG)) as f:  # serve's folder
            tail = f.read()[-2000:]
        raise RuntimeError(f"the rank zygote ended early (exit code {died}):\n{tail}")


# ------------------------------------------------------------------ the zygote


def start_vars(env) -> dict:
    """The variables of ``env`` that a forked rank could not change (:data:`AT_START`)."""
    return {k: v for k, v in env.items() if k.startswith(AT_START) and k not in PER_RANK}


def put_back(start: dict) -> None:
    """Give this (pytest) process's start-up variables the values ``start`` holds
    (:func:`start_vars` of its environment when its zygote started).

    Why: a module a test imports may set one for good (``import sklearn`` sets
    ``KMP_DUPLICATE_LIB_OK`` and ``KMP_INIT_AT_FORK``). The ranks started after it would
    carry it, the zygote would refuse each one, and every later rank of that pytest
    process would pay a fresh interpreter's start: in one CI run that tripled the suite's
    time. The variable only matters to a process that starts after it is set, and this
    one has started."""
    for k in start_vars(os.environ).keys() - start.keys():
        del os.environ[k]
    os.environ.update(start)


def _forkable(env: dict) -> bool:
    """Whether a rank with ``env`` may be forked from this process (started with its own
    environment): the variables read at start-up are the same."""
    return start_vars(env) == start_vars(os.environ)


def _die_with_parent() -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _read_request(conn: socket.socket):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 8)
    if len(data) < _INT.size:
        raise ConnectionError("a shim closed before its request")
    (size,) = _INT.unpack_from(data)
    data = data[_INT.size :]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ConnectionError("a shim closed mid-request")
        data += more
    return json.loads(data), fds


def serve(path: str):
    """The zygote's loop: fork a rank per request. Returns only in a forked rank, with
    (request, descriptors) for :func:`_become`."""
    import select

    import torch  # noqa: F401  (the point of the zygote: every rank finds it imported)

    _die_with_parent()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # shims connect only once torch is imported
    ranks: dict[socket.socket, int] = {}  # a shim's connection -> its rank's pid
    while True:
        live = [c for c, pid in ranks.items() if pid > 0]
        ready = select.select([listener, *live], [], [], 0.05)[0]
        _report_ended(ranks)
        for s in ready:
            if s is listener:
                forked = _fork_one(listener, ranks)
                if forked is not None:
                    return forked
            elif ranks.get(s, 0) > 0 and _closed(s):
                _orphaned(ranks, s)  # the shim is gone (SIGKILL): so is its rank


def _closed(conn: socket.socket) -> bool:
    """Whether a shim's connection has closed (it never sends once it has its answer)."""
    try:
        return not conn.recv(16)
    except OSError:
        return True


def _orphaned(ranks: dict, conn: socket.socket) -> None:
    """Kill the rank whose shim is gone; _report_ended reaps it and reports to no one.
    (Every error on one shim's connection ends that rank alone: a zygote that died of one
    would make every later rank of its pytest process a fresh interpreter, silently.)"""
    try:
        os.kill(ranks[conn], signal.SIGKILL)
    except ProcessLookupError:
        pass
    ranks[conn] = -ranks[conn]
    conn.close()


def _report_ended(ranks: dict) -> None:
    """Reap the ranks that ended and send each one's exit code to its shim."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for conn, p in list(ranks.items()):
            if abs(p) == pid:
                if p > 0:
                    try:
                        conn.sendall(_INT.pack(os.waitstatus_to_exitcode(status)))
                    except OSError:
                        pass
                    conn.close()
                del ranks[conn]


def _fork_one(listener: socket.socket, ranks: dict):
    """Accept a shim's request and fork its rank; returns (request, descriptors) in the
    rank, None in the zygote."""
    conn, _ = listener.accept()
    try:
        request, fds = _read_request(conn)
    except (ConnectionError, ValueError):
        conn.close()
        return None
    try:
        pid = os.fork() if _forkable(request["env"]) else None
    except OSError:  # no memory or processes left to fork with: the shim runs it fresh
        pid = None
    if pid is None:
        try:
            conn.sendall(_INT.pack(REFUSED))
        except OSError:
            pass  # the shim is gone: nothing to run
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    if pid == 0:
        listener.close()
        for c in ranks:
            if c.fileno() >= 0:
                c.close()
        conn.close()
        return request, fds
    for fd in fds:
        os.close(fd)
    ranks[conn] = pid
    try:
        conn.sendall(_INT.pack(pid))
    except OSError:  # the shim went before its answer (a job killed as it started)
        _orphaned(ranks, conn)
    return None


def _become(request: dict, fds: list[int]) -> None:
    """(In a forked rank.) Take the shim's descriptors, environment, folder and argv, and
    stdio as a fresh interpreter would open it."""
    import io

    high = [os.dup(fd) for fd in fds]  # out of the way of the numbers they go to
    for fd in fds:
        os.close(fd)
    for target, fd in zip(request["fds"], high):
        os.dup2(fd, target)
    for fd in high:
        if fd not in request["fds"]:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    enc = sys.stdout.encoding
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.open(0, "rb", closefd=False), encoding=enc, errors="strict"
    )
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        tty = raw.isatty()
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=enc,
            errors="backslashreplace" if fd == 2 else "strict",
            line_buffering=not unbuffered and (tty or fd == 2),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    if "numpy" in sys.modules:  # its global state was the zygote's: a fresh one per rank
        sys.modules["numpy"].random.seed()


# ------------------------------------------------------------------ the shim


def shim(argv: list[str]) -> None:
    """Have the zygote fork ``argv`` (a worker and its arguments) as this process's rank,
    forward signals to it and exit as it did; ``exec`` a fresh interpreter where the
    zygote refuses."""
    fds = [0, 1, 2]
    pmi = os.environ.get("PMI_FD", "")
    if pmi.isdigit():
        fds.append(int(pmi))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_wait_for(os.environ[SOCKET_ENV]))
    except (KeyError, OSError) as e:
        sys.stderr.write(f"zygote shim: no zygote ({e}); running a fresh interpreter\n")
        os.execv(sys.executable, [sys.executable, *argv])
    request = json.dumps(
        {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds}
    ).encode()
    socket.send_fds(conn, [_INT.pack(len(request)) + request], fds)
    pid = _read_int(conn)
    if pid is not None and pid != REFUSED:
        for fd in fds[3:]:  # MPI's PMI socket is the rank's alone (it closes it to finalize)
            os.close(fd)
    if pid is None or pid == REFUSED:
        conn.close()
        os.execv(sys.executable, [sys.executable, *argv])

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # it has ended: its status is on its way
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = _read_int(conn)
    if code is None:  # the zygote is gone: nothing reports this rank's end any more
        os.kill(pid, signal.SIGKILL)
        sys.stderr.write(f"zygote shim: the zygote died; rank {pid} killed\n")
        os._exit(1)
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def _wait_for(path: str, timeout: float = 120.0) -> str:
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return path


def _read_int(conn: socket.socket):
    data = b""
    while len(data) < _INT.size:
        more = conn.recv(_INT.size - len(data))
        if not more:
            return None
        data += more
    return _INT.unpack(data)[0]


if __name__ == "__main__":
    if sys.argv[1] == "run":
        shim(sys.argv[2:])
    elif sys.argv[1] == "serve":
        _request, _fds = serve(sys.argv[2])
        _become(_request, _fds)
        del _request, _fds
        import runpy

        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        sys.exit(f"usage: {sys.argv[0]} serve SOCKET | run WORKER ARGS...")
