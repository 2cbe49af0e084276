"""What a user's script shows when a commrt error escapes it, or a Ctrl-C ends it: the
user's frames and commrt's message, not commrt's own frames (``COMMRT_TRACEBACK=full``
shows them, chain and all); a misspelt keyword without the wrapper's frame; one line per
rank and exit status 130 for a Ctrl-C."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers.mp import free_port

from commrt import settings
from commrt.errors import SHORTENED

#: rank 1 runs two steps fewer than rank 0: rank 0's next step fails (PeerClosedError)
UNEVEN = """
import sys, torch, commrt
comm = commrt.init(backend="gloo", timeout=60)
model = torch.nn.Linear(10, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sync = commrt.GradientSync(model, comm, algorithm="ring")
for step in range(4 if comm.rank == 0 else 2):
    model(torch.randn(4, 10)).sum().backward()
    sync.step(opt)
"""
#: trains until interrupted, saying when it started
FOREVER = """
import torch, commrt
comm = commrt.init(backend="gloo", timeout=60)
model = torch.nn.Linear(10, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sync = commrt.GradientSync(model, comm, algorithm="ring")
print("training", flush=True)
while True:
    model(torch.randn(4, 10)).sum().backward()
    sync.step(opt)
"""
FRAME = re.compile(r'^  File "(.*)", line \d+, in ', re.M)
COMMRT_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (__import__("commrt"), __import__("commrt.algorithms").algorithms)
)


def _ranks(script: str, tmp_path, n=2, traceback=None, group=False):
    """Start ``n`` ranks of ``script`` from the environment, as a user launches without a
    launcher (rank 0 hosts the store); their outputs in tmp_path/rank<r>.txt. ``group``:
    in one process group of their own, rank 0's, as a launcher's workers are."""
    path = tmp_path / "user_script.py"
    path.write_text(script)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(n), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")  # fmt: skip
    env.pop(settings.TRACEBACK.name, None)
    if traceback is not None:
        env[settings.TRACEBACK.name] = traceback
    procs = []
    for r in range(n):
        out = open(tmp_path / f"rank{r}.txt", "w")
        pgid = (procs[0].pid if procs else 0) if group else None
        procs.append(subprocess.Popen([sys.executable, str(path)], stdout=out,
                                      stderr=subprocess.STDOUT, cwd=tmp_path, process_group=pgid,
                                      env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))  # fmt: skip
    return procs


def _finish(procs, tmp_path, timeout=120):
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return codes, [(tmp_path / f"rank{r}.txt").read_text() for r in range(len(procs))]


@pytest.mark.slow
def test_an_uncaught_commrt_error_shows_the_users_frames_and_its_message(tmp_path):
    codes, outs = _finish(_ranks(UNEVEN, tmp_path), tmp_path)
    assert codes[0] != 0, outs[0]
    frames = FRAME.findall(outs[0])
    assert frames and all(f.endswith("user_script.py") for f in frames), outs[0]
    assert "commrt.errors.PeerClosedError: commrt: rank 1" in outs[0], outs[0]
    assert SHORTENED in outs[0] and "The above exception" not in outs[0], outs[0]


@pytest.mark.slow
def test_commrt_traceback_full_shows_commrts_frames_and_the_chain(tmp_path):
    codes, outs = _finish(_ranks(UNEVEN, tmp_path, traceback="full"), tmp_path)
    frames = FRAME.findall(outs[0])
    assert codes[0] != 0 and "PeerClosedError" in outs[0], outs[0]
    assert any(f.startswith(COMMRT_DIRS) for f in frames), outs[0]
    assert "commrt/sync/gradsync.py" in outs[0] and SHORTENED not in outs[0], outs[0]


def test_a_misspelt_keyword_shows_no_wrapper_frame(tmp_path):
    script = tmp_path / "typo.py"
    script.write_text("import commrt\ncommrt.init(timout=3)\n")
    env = {k: v for k, v in os.environ.items() if k != settings.TRACEBACK.name}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert FRAME.findall(proc.stderr) == [str(script)], proc.stderr
    assert proc.stderr.rstrip().endswith("did you mean 'timeout'?"), proc.stderr


@pytest.mark.slow
def test_a_ctrl_c_ends_each_rank_with_one_line_and_130(tmp_path):
    # as a terminal's Ctrl-C under torchrun: SIGINT to every process of the job at once
    procs = _ranks(FOREVER, tmp_path, group=True)
    try:
        deadline = time.monotonic() + 120
        while "training" not in (tmp_path / "rank0.txt").read_text():
            assert time.monotonic() < deadline and procs[0].poll() is None, (
                tmp_path / "rank0.txt"
            ).read_text()
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(procs[0].pid, signal.SIGINT)
        codes, outs = _finish(procs, tmp_path, timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, out in enumerate(outs):
        said = [line for line in out.splitlines() if line and line != "training"]
        assert said == [f"commrt: rank {r}: interrupted (Ctrl-C or SIGINT); ending this rank"], out
    assert codes == [130, 130], outs


@pytest.mark.slow
def test_a_ctrl_c_under_torchrun_leaves_one_line_per_rank(tmp_path):
    # the terminal's Ctrl-C reaches torchrun and its workers (and torchrun passes one on):
    # each rank says it was interrupted, once, with no traceback of its own and no advice
    # to keep it running; torchrun's own report of the workers it stopped is torch's
    script = tmp_path / "user_script.py"
    script.write_text(FOREVER)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop(settings.TRACEBACK.name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(script)]  # fmt: skip
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp_path, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while (tmp_path / "out.txt").read_text().count("training") < 2:
            assert time.monotonic() < deadline and proc.poll() is None, (
                tmp_path / "out.txt"
            ).read_text()
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = (tmp_path / "out.txt").read_text()
    for r in range(2):
        line = f"commrt: rank {r}: interrupted (Ctrl-C or SIGINT); ending this rank"
        assert said.count(line) == 1, said
    assert "user_script.py" not in said and "KeyboardInterrupt" not in said, said
    assert "to keep it running" not in said, said
