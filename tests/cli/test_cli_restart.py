"""``commrt train --max-restarts N``: the launcher replaces a worker that died with a new
process under the same RANK, which rejoins the running backup-workers job (gloo), and the
job ends with every rank, the replacement too, at the final state. Bad uses get one
clear parser error."""

import os
import subprocess
import sys

import pytest
from helpers.cli import not_launched, parse_error  # noqa: F401  (the fixture runs here too)

from commrt.cli.tolerance import Replacements


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--max-restarts", "-1", "--algorithm", "backup"], "--max-restarts must be 0 or more"),
        (["--max-restarts", "1"], "--max-restarts needs --algorithm backup"),
        (
            ["--nproc", "4", "--max-restarts", "1", "--algorithm", "backup", "--backend", "mpi"],
            "only gloo lets a replacement rejoin",
        ),
    ],
)
def test_bad_restart_options_get_one_clear_line(argv, says, capsys):
    if "mpi" in argv:
        pytest.importorskip("mpi4py")  # without it, --backend mpi fails earlier
    assert says in parse_error(["train", *argv], capsys)


class _Proc:
    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_the_launcher_replaces_a_dead_rank_while_others_run_within_its_budget(capsys):
    started = []

    def start(rank, **env):
        started.append((rank, env))
        return _Proc(None)

    replace = Replacements(start, 1)
    procs = [_Proc(None), _Proc(-9), _Proc(None)]
    replace(procs)
    assert started == [(1, {"COMMRT_REJOIN": "1"})] and procs[1].code is None
    procs[2] = _Proc(1)
    replace(procs)  # the budget is spent: rank 2 stays failed
    assert len(started) == 1 and procs[2].code == 1
    assert "rank 1 was killed by SIGKILL; started a replacement (1 of 1)" in capsys.readouterr().err
    done = Replacements(start, 5)
    done([_Proc(0), _Proc(-9)])  # nobody runs any more: nothing to rejoin
    assert len(started) == 1


def test_on_a_terminal_the_replacement_note_leaves_the_progress_bar_its_line(monkeypatch):
    """Rank 0's bar holds the terminal's cursor mid-line while training runs: the
    launcher's note starts a line of its own there (and none in a pipe)."""
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, before in ((Terminal(), "\n"), (io.StringIO(), "")):
        stream.write("44/264 epoch 2/12 loss 1.217")  # the bar, mid-line
        monkeypatch.setattr(sys, "stderr", stream)
        Replacements(lambda rank, **env: _Proc(None), 1)([_Proc(None), _Proc(-9)])
        note = "commrt: rank 1 was killed by SIGKILL; started a replacement (1 of 1)\n"
        assert stream.getvalue() == f"44/264 epoch 2/12 loss 1.217{before}{note}"


@pytest.mark.slow
def test_train_restarts_a_killed_worker_which_rejoins_and_ends_with_the_others():
    """4 gloo ranks, b = 1, rank 1 SIGKILLed before its step 3; the others are slowed
    (0.25 s a step) so that training lasts while the replacement starts. The job succeeds,
    and the summary's 'missing ranks' is none: the replacement held the final state at
    close() like every other rank (the bits are checked in tests/multiprocess/test_backup_rejoin.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "PMI_SIZE", "RANK")}
    argv = ["--nproc", "4", "--algorithm", "backup", "--backups", "1", "--kill", "1:3"]
    argv += ["--max-restarts", "1", "--epochs", "6", "--timeout", "60", "--quiet"]
    argv += ["--straggler", "0:0.25,2:0.25,3:0.25"]
    proc = subprocess.run(
        [sys.executable, "-m", "commrt", "train", "--backend", "gloo", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "rank 1 was killed by SIGKILL; started a replacement (1 of 1)" in proc.stderr
    rows = {ln[:29].strip(): ln[29:].strip() for ln in proc.stdout.splitlines()}
    assert rows.get("missing ranks") == "none", proc.stdout
    dropped = rows["dropped gradients"].replace(",", "").split()[::2]
    assert set(dropped) == {"r0", "r1", "r2", "r3"}, rows  # rank 1's replacement reached the end


def test_a_replacement_that_comes_after_the_job_leaves_with_one_line(monkeypatch, capsys):
    """The README's own restart command on a loaded machine: the replacement started after
    the short job had ended. It has nothing to join and nothing is lost, so one message
    within 80 columns and exit 0, not a traceback; any other error still propagates."""
    from commrt.cli import train
    from commrt.sync.backup import RejoinedTooLate

    def late(s):  # gossip's words, which ran past 80 columns in one line
        raise RejoinedTooLate(
            "commrt: rank 2 came back (2.1) after every other rank had finished or died: "
            "there is nothing left to join"
        )

    monkeypatch.setattr(train, "gradient_sync", late)
    assert train.open_sync(None) is None
    err = capsys.readouterr().err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 2 and all(len(x) <= 80 for x in lines), lines
    assert lines[0].startswith("commrt: rank 2 came back") and lines[1].startswith("  ")
    assert err.rstrip().endswith("this replacement leaves") and "Traceback" not in err

    def broken(s):
        raise ValueError("something else")

    monkeypatch.setattr(train, "gradient_sync", broken)
    with pytest.raises(ValueError, match="something else"):
        train.open_sync(None)
