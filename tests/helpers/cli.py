"""Running the `commrt` command in tests: a subprocess, a pseudo-terminal, its summary and its errors."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from commrt.cli import main


def run_commrt(*args, timeout=240):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE")
    }
    return subprocess.run(
        [sys.executable, "-m", "commrt", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def parse_summary(out: str) -> dict:
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(.+)$", line)
        if m:
            rows[m.group(1).strip()] = m.group(2).strip()
    return rows


def size_bytes(text: str) -> float:
    """Bytes of a size as commrt prints it ("340 KiB per rank" -> 348160.0)."""
    m = re.match(r"\s*([\d.]+) (B|KiB|MiB|GiB)\b", text)
    assert m, f"no size in {text!r}"
    return float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]]


def run_in_pty(argv, cols=80, rows=24, timeout=300, cwd=None):
    """Run ``argv`` (in ``cwd``) with stdout/stderr on a pseudo-terminal of ``cols`` columns;
    return (rc, text)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE", "COLUMNS", "LINES")
    }
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, cwd=cwd
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    rc = proc.wait(timeout)
    os.close(master)
    return rc, b"".join(chunks).decode(errors="replace")


@pytest.fixture(autouse=True)
def not_launched(monkeypatch):
    """These run as the user's own command, not as a rank some launcher started."""
    for k in ("COMMRT_LAUNCHED", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "RANK"):
        monkeypatch.delenv(k, raising=False)


def parse_error(argv, capsys) -> str:
    """The one error main(argv) exits 2 with, as one line (the CLI wraps it at 80
    columns, its later lines indented: they are joined back here)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    errors = [i for i, ln in enumerate(lines) if ": error: " in ln]
    assert len(errors) == 1 and "Traceback" not in err, err
    rest = lines[errors[0] :]
    n = 1 + next((i for i, ln in enumerate(rest[1:]) if not ln.startswith("  ")), len(rest) - 1)
    return " ".join(ln.strip() for ln in rest[:n])


def rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of rank ``rank`` among the launcher's children (from /proc), or None."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher and f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def statements(stderr: str) -> list[str]:
    """The launcher's statements, each whole: a wrapped one goes on in indented lines."""
    said = []
    for line in stderr.strip().splitlines():
        if line.startswith("  ") and said:
            said[-1] += " " + line.strip()
        else:
            said.append(line)
    return said


def start_commrt(*argv, stderr=subprocess.PIPE) -> subprocess.Popen:
    """``python -m commrt *argv`` started as a user starts it (no rank of an outer job in
    its environment), its output as text on pipes."""
    job = ("RANK", "WORLD_SIZE", "PMI_RANK", "PMI_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in job}
    return subprocess.Popen(
        [sys.executable, "-m", "commrt", *argv],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )
