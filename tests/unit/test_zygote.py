"""The test ranks' zygote (tests/helpers/zygote.py): a rank forked from it is what its
shim was asked to run (argv, environment, folder, descriptors), ends as the shim says, and
dies with it; a rank whose start-up environment differs runs fresh instead."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import zygote

REPORT = """
import json, os, sys
import torch
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(), "ppid": os.getppid(),
    "path0": sys.path[0], "var": os.environ.get("ZYGOTE_TEST_VAR"),
}), flush=True)
sys.exit(int(os.environ.get("ZYGOTE_TEST_CODE", "0")))
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "w" / "worker.py"
    path.parent.mkdir()
    path.write_text(REPORT)
    return str(path)


@pytest.fixture(scope="module")
def own_zygote(tmp_path_factory):
    """A zygote of this module's own (the session's may be off: TEST_FRESH_RANKS), with
    the session's socket put back after."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(zygote.FRESH_ENV, raising=False)
        mp.delenv(zygote.SOCKET_ENV, raising=False)
        proc = zygote.start(str(tmp_path_factory.mktemp("own_zygote")))
        yield proc
        zygote.stop(proc)


def rank_env(**env):
    """The environment the helpers give ranks (the zygote's thread count: tests/helpers/mp.py)."""
    return dict(os.environ, OMP_NUM_THREADS="1", **env)


def _run(argv, **env):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=rank_env(**env))


def test_a_forked_rank_gets_its_argv_environment_folder_and_exit_code(own_zygote, worker, tmp_path):
    import json

    cmd = zygote.command(worker, "a", 2)
    assert cmd[:2] == [sys.executable, "-S"] and cmd[-3:] == [worker, "a", "2"], cmd
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=rank_env(ZYGOTE_TEST_VAR="x", ZYGOTE_TEST_CODE="3"),
    )
    assert proc.returncode == 3, proc.stderr
    got = json.loads(proc.stdout)
    assert got["argv"] == [worker, "a", "2"] and got["var"] == "x", got
    assert got["cwd"] == str(tmp_path) and got["path0"] == os.path.dirname(worker), got
    assert got["ppid"] == own_zygote.pid, "not forked from the zygote"


def test_a_rank_whose_start_up_variables_differ_runs_fresh(own_zygote, worker):
    import json

    proc = _run(zygote.command(worker), PYTHONPATH=os.pathsep.join(sys.path))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["ppid"] == os.getpid(), "the shim did not become the rank"


def _sleeping_rank(tmp_path):
    """A shim whose rank prints its pid and sleeps: (the shim's Popen, the rank's pid)."""
    (tmp_path / "sleeper.py").write_text(
        "import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen(
        zygote.command(str(tmp_path / "sleeper.py")),
        stdout=subprocess.PIPE,
        text=True,
        env=rank_env(),
    )
    return proc, int(proc.stdout.readline())


def test_signals_reach_the_rank_and_the_shim_dies_as_it_did(own_zygote, tmp_path):
    proc, rank = _sleeping_rank(tmp_path)
    assert rank != proc.pid
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):  # ended and reaped by the zygote
        os.kill(rank, 0)


def test_a_killed_shim_takes_its_rank_with_it(own_zygote, tmp_path):
    proc, rank = _sleeping_rank(tmp_path)
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(rank, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"rank {rank} outlived its shim by 10 s")


def test_without_a_zygote_a_rank_is_a_fresh_interpreter(monkeypatch, worker):
    monkeypatch.delenv(zygote.SOCKET_ENV, raising=False)
    assert zygote.command(worker, 1) == [sys.executable, worker, "1"]


def test_a_shim_gone_before_its_answer_leaves_the_zygote_serving(own_zygote, worker, tmp_path):
    # A shim killed between its request and the zygote's answer (a job killed as it starts):
    # the zygote's answer then meets a closed socket. Its loop must go on: a zygote gone
    # silently makes every later rank of this pytest process a fresh interpreter.
    import json
    import socket

    marker = tmp_path / "ran"
    (tmp_path / "touch.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    request = json.dumps(
        {"argv": [str(tmp_path / "touch.py")], "env": rank_env(), "cwd": str(tmp_path),
         "fds": [0, 1, 2]}
    ).encode()  # fmt: skip
    with open(os.devnull, "rb") as i, open(os.devnull, "wb") as o:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(zygote._wait_for(os.environ[zygote.SOCKET_ENV]))
        fds = [i.fileno(), o.fileno(), o.fileno()]
        socket.send_fds(conn, [zygote._INT.pack(len(request)) + request], fds)
        conn.close()  # gone before the zygote answers with the rank's pid
    time.sleep(1.0)
    assert own_zygote.poll() is None, "the zygote died when a shim went away early"
    proc = _run(zygote.command(worker))  # and the next rank is still forked
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ppid"] == own_zygote.pid, proc.stderr


def test_a_zygote_that_ended_early_is_an_error_when_it_is_stopped(monkeypatch, tmp_path):
    monkeypatch.delenv(zygote.FRESH_ENV, raising=False)
    monkeypatch.delenv(zygote.SOCKET_ENV, raising=False)
    proc = zygote.start(str(tmp_path))
    proc.kill()
    proc.wait(30)
    with pytest.raises(RuntimeError, match="ended early"):
        zygote.stop(proc)


def test_a_start_up_variable_an_import_set_is_put_back_and_ranks_fork_again(
    own_zygote, worker, monkeypatch
):
    # `import sklearn` sets KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK in os.environ: every
    # rank started afterwards carried them, and the zygote refused it (a fresh interpreter)
    import json

    start = zygote.start_vars(os.environ)
    monkeypatch.setitem(os.environ, "KMP_INIT_AT_FORK", "FALSE")  # undone at the end anyway
    refused = json.loads(_run(zygote.command(worker)).stdout)
    assert refused["ppid"] == os.getpid(), "forked although its start-up variables differ"
    zygote.put_back(start)  # what conftest's start_up_variables does after each test
    assert zygote.start_vars(os.environ) == start
    forked = json.loads(_run(zygote.command(worker)).stdout)
    assert forked["ppid"] == own_zygote.pid
