"""A reader that goes away (``commrt train | head -2``): the command ends quietly, as a
Unix command does, with the exit status the quickstart names (141), nothing on stderr,
and no process of the job left behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from commrt.cli.launch import mpiexec_path
from commrt.cli.output import READER_LEFT


def _piped(args, lines: int, tmp_path):
    """Run ``commrt <args>`` in a session of its own with stdout into a pipe; read
    ``lines`` lines, then close the reading end as ``head`` does (``lines=0``: before the
    command starts, as ``| true`` may). Returns (commrt's own exit status, stderr, the
    session's processes still alive a second later)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "RANK", "WORLD_SIZE")}
    read, write = os.pipe()
    if lines == 0:
        os.close(read)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "commrt", *args],
            stdout=write,
            stderr=err,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    os.close(write)
    try:
        if lines:
            with os.fdopen(read) as reader:
                for _ in range(lines):
                    assert reader.readline(), err_path.read_text()[-3000:]
        code = proc.wait(timeout=120)
        time.sleep(1)
        left = _session(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return code, err_path.read_text(), left


def _session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.getsid(int(name)) == sid:
                out.append(int(name))
        except ProcessLookupError:
            pass
    return out


@pytest.mark.parametrize(
    "backend",
    [
        "auto",  # shm here: the launcher's own ranks
        pytest.param(
            "mpi", marks=pytest.mark.skipif(mpiexec_path() is None, reason="needs mpiexec")
        ),  # mpiexec's ranks, whose output reaches the pipe through mpiexec
    ],
)
@pytest.mark.slow
def test_train_into_head_ends_every_rank_quietly(backend, tmp_path):
    # the launcher's line and rank 0's first phase: every line after them fails
    code, err, left = _piped(["train", "--epochs", "300", "--backend", backend], 2, tmp_path)
    assert (code, err) == (READER_LEFT, ""), err[-3000:]
    assert left == [], f"processes of the job still running: {left}"


@pytest.mark.slow
def test_simulate_into_head_ends_quietly(tmp_path):
    # its header comes at once, its tables after seconds of modelling: the reader leaves
    # in between, as `head -3` does
    code, err, left = _piped(["simulate"], 3, tmp_path)
    assert (code, err) == (READER_LEFT, ""), err[-3000:]
    assert left == []


def test_diagnose_into_a_closed_pipe_ends_quietly(tmp_path):
    views = [
        {"rank": r, "host": "h", "pid": 100 + r, "state": "published", "idle_s": 9.0,
         "position": {"kind": "all_reduce", "algorithm": "ring", "numel": 8, "seq": 5,
                      "dtype": "float32", "in_call": True, "step": 0, "peer": 1 - r},
         "stack": []}
        for r in range(2)
    ]  # fmt: skip
    dump = tmp_path / "dump"
    dump.mkdir()
    for r in range(2):
        data = {"rank": r, "positions": [views[r]["position"]], "verdict": {"views": views}}
        (dump / f"rank{r}.json").write_text(json.dumps(data))
    code, err, left = _piped(["diagnose", str(dump)], 0, tmp_path)
    assert (code, err) == (READER_LEFT, ""), err[-3000:]
    assert left == []
