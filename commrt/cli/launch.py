"""Start N local worker processes for the ``commrt`` command line.

``commrt train --nproc 4`` (or ``bench``) re-runs itself as 4 ranks:
under ``mpiexec`` for the mpi backend, otherwise as plain subprocesses with
the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) set. If any rank fails, the others are stopped,
the last lines name the rank that died (by which signal), stopped or
failed, and its exit code is returned: a crashed worker never leaves the
rest hanging. A Ctrl-C reaches the launcher and every rank (the terminal
sends it to the whole process group): the launcher alone answers it, with
one line and status 130, and no rank prints a traceback (:func:`interrupted`).
A SIGTERM or SIGHUP to the launcher alone (a scheduler, a closed terminal)
stops every rank too, with one line and status 128 + the signal's number.

Every rank runs on this host, so the job listens on loopback only: the
stores bind 127.0.0.1 (:func:`commrt.runtime.store.serve`) and gloo gets
``GLOO_SOCKET_IFNAME=lo`` unless the caller set it.

With ``tolerate=b`` (``commrt train --algorithm backup``) up to b ranks may
die while the others carry on; the launcher then also hosts the control
store (``host_store``, :mod:`commrt.runtime.store`) so that any rank, rank 0 too,
may be the one that dies. Under mpiexec that takes MPICH's
``-disable-auto-cleanup`` (passed here; without it Hydra kills every rank
when one dies). torchrun has no such switch: its agent stops all workers
on any failure (and restarts them if ``--max-restarts`` allows).

With ``restarts=n`` as well (``commrt train --max-restarts N``, gloo only),
a worker that dies while others still run is replaced: the launcher starts
the same command with the same RANK and ``COMMRT_REJOIN=1``, and the
replacement rejoins the running job (:mod:`commrt.sync.backup.rejoin`), up
to n replacements in all. The job then succeeds when every rank's last
process finished well.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Sequence

from commrt import settings
from commrt.cli import output
from commrt.cli.ctrl_c import deaf_to_ctrl_c, pass_on_again, quiet_rank_cmd
from commrt.cli.tolerance import Lingering, Replacements, signame, stopped_now

#: the one line a Ctrl-C leaves, whenever it comes (the docs' quick start promises it)
STOPPED = "commrt: interrupted; stopped the job"
_APPLIES = "the command line's ranks"
MPIEXEC_GRACE_S = settings.Seconds(
    3.0,
    "how long mpiexec's ranks get to end by themselves after a Ctrl-C (each with 130) "
    "before they are stopped",
    _APPLIES,
    settings.COMMAND_LINE,
)
KILL_AFTER_S = settings.Seconds(
    5.0,
    "how long a rank that is stopped with SIGTERM gets before SIGKILL",
    _APPLIES,
    settings.COMMAND_LINE,
)


def _past_echo() -> str:
    """A newline where stderr is a terminal (it echoed ``^C``); none into a file or pipe."""
    return "\n" if sys.stderr.isatty() else ""


_reports: dict[str, str] = {}


def process_started_at() -> float:
    """When commrt started in this process, in ``time.time()`` seconds: its first import
    (the seconds spent importing torch count). Not the process's own start: a shell that
    exec'd commrt after other work (``bash -c "sleep 10 && commrt train"``) shares its
    process, and that work is none of commrt's start-up."""
    import commrt

    return commrt._imported_at


def launched_at() -> float:
    """When this job was launched: the launcher's start, handed down in the environment,
    else commrt's start in this process."""
    try:
        return float(os.environ[settings.LAUNCHED_AT.name])
    except (KeyError, ValueError):
        return process_started_at()


def already_launched() -> bool:
    """True inside a rank started by mpiexec, torchrun or :func:`launch`."""
    env = os.environ
    return bool(
        env.get(settings.LAUNCHED.name)
        or "PMI_RANK" in env
        or "OMPI_COMM_WORLD_RANK" in env
        or ("RANK" in env and "WORLD_SIZE" in env)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_ifname() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def mpiexec_path() -> str | None:
    return shutil.which("mpiexec") or shutil.which("mpirun")


def launch(
    argv: Sequence[str],
    nproc: int,
    *,
    use_mpiexec: bool,
    timeout: float | None = None,
    quiet_workers: bool = True,
    host_store: bool = False,
    tolerate: int = 0,
    restarts: int = 0,
    linger_s: float | None = None,
) -> int:
    """Run ``python -m commrt <argv>`` as ``nproc`` ranks; return the exit code.

    Rank 0 keeps stdout (the progress bar and tables); the other ranks'
    stdout is dropped when ``quiet_workers``; every rank keeps stderr.
    ``host_store``: host a TCPStore here for the ranks (``COMMRT_STORE``,
    and the gloo rendezvous). ``tolerate``: how many ranks may die before
    the launcher stops the rest; ``restarts``: how many replacements it may start for
    ranks that died (see the module docs); ``linger_s``: with ``tolerate``, how long up
    to that many ranks may go on running once all the others finished well before they
    are stopped (:class:`Lingering`; None: as long as they like).
    """
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    output.supervising()  # the reader leaving stops the ranks here (_poll_ranks)
    cmd = [sys.executable, "-m", "commrt", *argv]
    mpi_cmd = quiet_rank_cmd(argv)
    env = ranks_env(nproc)
    store = None
    if host_store:
        from commrt.runtime.store import host_store as make_store

        store = make_store()  # lives as long as this process: the workers' control plane
        env[settings.STORE.name] = f"127.0.0.1:{store.port}"
    if use_mpiexec:
        exe = mpiexec_path()
        if exe is None:
            raise RuntimeError(
                "backend mpi needs mpiexec: pip install 'commrt[mpi]' (the mpich wheel "
                "brings it), or use --backend gloo"
            )
        keep_going = ["-disable-auto-cleanup"] if tolerate else []
        procs = [subprocess.Popen([exe, *keep_going, "-n", str(nproc), *mpi_cmd], env=env)]
        # mpiexec names failed ranks itself, and passes a Ctrl-C on to the ranks: they leave
        # with 130 (interrupted()) and it follows, unless a SIGTERM from us comes first and
        # makes it print its "BAD TERMINATION" banner
        return _supervise(procs, timeout, ranks_known=False, interrupt_grace_s=MPIEXEC_GRACE_S)
    else:
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
        )
        env[settings.PEER_REPORTS.name] = _reports["dir"] = tempfile.mkdtemp(prefix="commrt-peers-")
        if store is not None:  # the rendezvous too, so that rank 0 is not special
            env.update(MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="true")

        def start(r: int, **more) -> subprocess.Popen:
            out = subprocess.DEVNULL if (quiet_workers and r) else None
            rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(r), **more)
            with deaf_to_ctrl_c():
                return subprocess.Popen(cmd, env=rank_env, stdout=out)

        procs = []
        try:
            for r in range(nproc):
                procs.append(start(r))
        except KeyboardInterrupt:  # the ranks started so far are deaf to it: stop them
            _stop(procs)
            raise
    replace = Replacements(start, restarts) if restarts else None
    linger = Lingering(tolerate, linger_s)
    try:
        return _supervise(procs, timeout, tolerate=tolerate, replace=replace, linger=linger)
    finally:
        shutil.rmtree(_reports.pop("dir", ""), ignore_errors=True)


def ranks_env(nproc: int) -> dict[str, str]:
    """The environment every one of ``nproc`` ranks on this host starts with: this one,
    marked launched (and when), unbuffered, a share of the cores each, gloo on loopback."""
    env = dict(os.environ, **{settings.LAUNCHED.name: "1", "PYTHONUNBUFFERED": "1"})
    env.setdefault(settings.LAUNCHED_AT.name, repr(process_started_at()))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # every rank is on this host: keep gloo's sockets on loopback too (it would bind to
    # the address of the host name otherwise); the stores listen on 127.0.0.1 (store.serve)
    lo = loopback_ifname()
    if lo is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
    return env


def _supervise(
    procs: list[subprocess.Popen],
    timeout: float | None,
    ranks_known: bool = True,
    tolerate: int = 0,
    replace: Replacements | None = None,
    interrupt_grace_s: float = 0.0,
    linger: Lingering | None = None,
) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        with _answering(signal.SIGTERM, signal.SIGHUP):
            return _poll_ranks(procs, deadline, timeout, ranks_known, tolerate, replace, linger)
    except KeyboardInterrupt:
        if interrupt_grace_s:  # mpiexec: its ranks end by themselves, each with 130
            _wait_all(procs, interrupt_grace_s / 3)
            pass_on_again(procs)
        _stop(procs, grace_s=interrupt_grace_s)
        print(f"{_past_echo()}{STOPPED}", file=sys.stderr)
        return 130
    except _Signalled as sig:
        # a scheduler's or a closed terminal's way to end the job: the ranks are this
        # launcher's children, not the signal's target, and would go on without us.
        # mpiexec passes a SIGINT on to its ranks, which leave quietly (interrupted())
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        _stop(procs, grace_s=interrupt_grace_s)
        print(f"{_past_echo()}commrt: got {signame(sig.signum)}; stopped the job", file=sys.stderr)
        return 128 + sig.signum


def _poll_ranks(procs, deadline, timeout, ranks_known, tolerate, replace, linger) -> int:
    """:func:`_supervise`'s loop: poll the ranks until the job's outcome is known."""
    while True:
        codes = [p.poll() for p in procs]
        if output.READER_LEFT in codes or output.reader_left():  # `commrt train | head`
            return output.stop_quietly(procs, _stop)
        if replace is not None:
            replace(procs)
            codes = [p.poll() for p in procs]
        overdue = [] if linger is None or not ranks_known else linger.overdue(codes)
        if overdue:
            said = linger.lines(procs, overdue) + tolerated_lines(codes, tolerate)
            _stop([procs[r] for r in overdue])
            for line in said:
                print(line, file=sys.stderr, flush=True)
            return 0
        bad = [c for c in codes if c not in (None, 0)]
        if bad and len(bad) <= tolerate and ranks_known:
            if None in codes:
                time.sleep(0.05)
                continue
            for line in tolerated_lines(codes, tolerate):
                print(line, file=sys.stderr, flush=True)
            return 0
        if bad:
            # a rank that died takes its peers down a moment later (connection reset,
            # timeout): give them that moment, so the report names the cause first
            time.sleep(0.5)
            story, code = what_happened(procs, _reports.get("dir")) if ranks_known else ([], bad[0])
            _stop(procs)
            for line in story:
                said = textwrap.fill(f"commrt: {line}", 80, subsequent_indent="  ")
                print(said, file=sys.stderr, flush=True)
            return code
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            _stop(procs)
            print(
                f"commrt: workers did not finish within {timeout:g} s; stopped them",
                file=sys.stderr,
            )
            return 124
        time.sleep(0.05)


class _Signalled(Exception):
    """The launcher got a signal that ends the job (:func:`_answering`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _answering(*signums):
    """Inside, each of ``signums`` raises :class:`_Signalled` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def handler(signum, _frame):
        raise _Signalled(signum)

    previous = {n: signal.signal(n, handler) for n in signums}
    try:
        yield
    finally:
        for n, h in previous.items():
            signal.signal(n, h)


def tolerated_lines(codes: list[int | None], tolerate: int) -> list[str]:
    """What the launcher says when up to ``tolerate`` ranks failed and the rest finished:
    a line per failed rank, then the allowance (each within 80 columns)."""
    lines = []
    for rank, c in enumerate(codes):
        if c:
            how = f"was killed by {signame(-c)}" if c < 0 else f"exited with status {c}"
            lines.append(f"commrt: rank {rank} {how}; the other ranks carried on")
    lines.append(f"commrt: (up to {tolerate} of the {len(codes)} ranks may fail in this job)")
    return lines


def what_happened(procs: list[subprocess.Popen], folder: str | None) -> tuple[list[str], int]:
    """Lines naming the failed ranks, causes first, and the exit code to return.

    A rank killed by a signal or stopped is the likely cause; ranks that
    exited with an error status usually followed it. A rank whose report
    (:func:`peer_reports`) blames another rank, or when no cause is known,
    has its error's first line added: something else happened there."""
    killed, stopped, failed = [], [], []
    for rank, p in enumerate(procs):
        c = p.poll()
        if c is None:
            if stopped_now(p.pid):
                stopped.append(rank)
        elif c < 0:
            killed.append((rank, c))
        elif c > 0:
            failed.append((rank, c))
    seen = peer_reports(folder)
    lines = [f"rank {r} was killed by {signame(-c)}{_during(r, seen)}" for r, c in killed]
    lines += [
        f"rank {r} is stopped (SIGSTOP or a debugger), so its peers timed out{_during(r, seen)}"
        for r in stopped
    ]
    causes = {r for r, _ in killed} | set(stopped)
    lines += [
        f"rank {r} exited with status {c}"
        + (" after that" if causes else "")
        + _saw(r, seen, causes)
        for r, c in failed
    ]
    lines.append(f"stopped the other ranks of this {len(procs)}-rank job")
    code = 128 - killed[0][1] if killed else (failed[0][1] if failed else 1)
    return lines, code


def _saw(rank: int, reports: list[dict], causes: set[int]) -> str:
    """``rank``'s own error, where it blames a rank other than ``causes`` (or none is known)."""
    for r in reports:
        blamed = {p for p in r.get("peers") or [] if p is not None}
        if r.get("rank") == rank and r.get("error") and (not causes or blamed - causes):
            return f": {r['error']}"
    return ""


def peer_reports(folder: str | None) -> list[dict]:
    """What the ranks that a peer failed under were doing (see ``COMMRT_PEER_REPORTS``)."""
    found = []
    for name in sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, name)) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            continue
    return found


def _during(rank: int, reports: list[dict]) -> str:
    """``rank``'s death (or stop) in the survivors' terms: training step, algorithm, bucket."""
    for r in sorted(reports, key=lambda r: rank not in (r.get("peers") or [])):
        where = f", while rank {r['rank']} ran {r['where']}" if r.get("where") else ""
        return f" at training step {r['step']}{where}"
    return ""


def interrupted() -> int:
    """What the command does on a Ctrl-C: one line and 130, the shell's status for it.
    A rank leaves at once (``os._exit``: an exit handler such as ``MPI_Finalize`` could
    wait on peers that are leaving too); this launcher's own ranks leave the line to it
    (:func:`_supervise`), as a line per rank would bury it. The launcher, interrupted
    before it supervises (still starting), has stopped whatever it started: the same
    line as :func:`_supervise`'s."""
    sys.stdout.flush()
    if already_launched():
        if not settings.LAUNCHED.text():
            print("\ncommrt: interrupted", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(130)
    print(f"{_past_echo()}{STOPPED}", file=sys.stderr, flush=True)
    return 130


def _wait_all(procs: list[subprocess.Popen], seconds: float) -> None:
    """Wait up to ``seconds`` in all for every process to end by itself."""
    end = time.monotonic() + seconds
    for p in procs:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def _stop(procs: list[subprocess.Popen], grace_s: float = 0.0) -> None:
    """Stop every process still running: those that do not exit within ``grace_s`` by
    themselves get SIGTERM, and :data:`KILL_AFTER_S` later SIGKILL."""
    _wait_all(procs, grace_s)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.send_signal(signal.SIGCONT)  # a stopped rank only acts on SIGTERM once it runs
    end = time.monotonic() + KILL_AFTER_S
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
