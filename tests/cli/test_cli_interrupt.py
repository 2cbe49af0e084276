"""A Ctrl-C on ``commrt train``: every process of the job ends, promptly, status 130, with
one line from the launcher and no traceback from the ranks (which the terminal's Ctrl-C
reaches as well: it goes to the whole foreground process group)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.layout import ROOT

from commrt import settings
from commrt.cli.ctrl_c import quiet_rank_cmd
from commrt.cli.launch import STOPPED, mpiexec_path


def _ctrl_c(backend: str, marker: str, after_s: float, sig=signal.SIGINT, group=True):
    """Start ``commrt train`` as a terminal would (its own process group, SIGINT not
    ignored), wait for a stdout line starting with ``marker``, then ``after_s`` seconds,
    and send ``sig`` to the group (``group=False``: to the launcher alone). Returns (status, stdout, stderr, seconds to end, the
    group's processes left a second later)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "RANK", "WORLD_SIZE")}
    cmd = [sys.executable, "-m", "commrt", "train", "--backend", backend, "--epochs", "300"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        # a background job of a non-interactive shell ignores SIGINT, and so would we
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        seen = []
        while not (seen and seen[-1].startswith(marker)):
            line = proc.stdout.readline()
            assert line, f"ended before {marker!r}: {''.join(seen)}{proc.stderr.read()[-2000:]}"
            seen.append(line)
        time.sleep(after_s)
        t0 = time.monotonic()
        (os.killpg if group else os.kill)(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
        time.sleep(1)
        left = _group(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, "".join(seen) + out, err, took, left


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.getpgid(int(name)) == pgid:
                out.append(int(name))
        except ProcessLookupError:
            pass
    return out


@pytest.mark.parametrize(
    "backend,marker,after_s",
    [
        ("gloo", "starting 2 ranks", 1.0),  # the ranks are importing torch
        ("gloo", "epoch 1/300", 0.3),  # mid-step: in the backward's hooks or a wait
        *(
            pytest.param(
                "mpi",
                marker,
                after_s,
                marks=pytest.mark.skipif(mpiexec_path() is None, reason="needs mpiexec"),
            )
            # mpiexec passes the Ctrl-C on to ranks that are importing torch, or training
            for marker, after_s in (("starting 2 ranks", 0.3), ("epoch 1/300", 0.3))
        ),
    ],
)
@pytest.mark.slow
def test_ctrl_c_ends_the_job_with_one_line(backend, marker, after_s):
    code, out, err, took, left = _ctrl_c(backend, marker, after_s)
    assert code == 130, (out[-1000:], err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "BAD TERMINATION" not in out + err, (out + err)[-3000:]
    assert err.strip().splitlines()[-1:] == [STOPPED], err[-2000:]
    assert not err.startswith("\n") and "\n\n" not in err, err  # a pipe: no ^C to step past
    assert took < 15, took
    assert left == [], f"processes of the job still running: {left}"


@pytest.mark.parametrize(
    "backend,sig",
    [
        ("gloo", signal.SIGTERM),
        ("gloo", signal.SIGHUP),
        pytest.param(
            "mpi",
            signal.SIGTERM,
            marks=pytest.mark.skipif(mpiexec_path() is None, reason="needs mpiexec"),
        ),
    ],
)
@pytest.mark.slow
def test_a_signal_to_the_launcher_alone_stops_every_rank(backend, sig):
    # a scheduler (SIGTERM) or a closed terminal (SIGHUP) signals the launcher only: its
    # ranks went on training without it, and finished after it had gone
    code, out, err, took, left = _ctrl_c(backend, "epoch 1/300", 0.3, sig=sig, group=False)
    assert code == 128 + sig, (out[-1000:], err[-3000:])
    assert err.strip().splitlines()[-1:] == [f"commrt: got {sig.name}; stopped the job"], err
    assert took < 15, took
    assert left == [], f"processes of the job still running: {left}"


def test_a_ctrl_c_before_the_launcher_supervises_leaves_the_same_line(monkeypatch, capsys):
    """Interrupted while it starts (before it supervises the ranks), the launcher says
    what it says when it supervises: it printed only 'commrt: interrupted'."""
    from commrt.cli import launch

    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "WORLD_SIZE", settings.LAUNCHED.name):
        monkeypatch.delenv(var, raising=False)
    assert launch.interrupted() == 130
    assert capsys.readouterr().err.strip() == STOPPED


def test_the_line_a_ctrl_c_leaves_is_the_one_the_quick_start_promises():
    assert f"(`{STOPPED}`)" in (ROOT / "docs" / "quickstart.md").read_text()


def test_a_rank_under_mpiexec_ends_quietly_on_a_ctrl_c_at_any_moment_of_its_start():
    """mpiexec passes a Ctrl-C on to ranks that may still be in Python's own start-up (the
    site packages' .pth files), where a KeyboardInterrupt prints 'Fatal Python error' and
    a traceback. The rank's command holds the SIGINT until it can end with 130 quietly."""
    cmd = quiet_rank_cmd(["--help"])
    ends = set()
    for step in range(24):  # from the exec through the start-up and into commrt itself
        p = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        time.sleep(step * 0.006)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert err == "", (step, err[-2000:])
        # 130: ended by the SIGINT. A SIGINT in the first milliseconds, before sh or
        # python set it aside, ends sh (-SIGINT) or is lost: --help then ends with 0
        assert p.returncode in (130, 0, -signal.SIGINT), (step, p.returncode)
        ends.add(p.returncode)
    assert 130 in ends, ends
