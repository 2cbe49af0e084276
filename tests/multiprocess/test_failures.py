"""What happens when a rank stops, dies or calls the wrong thing: the job ends
with a non-zero status and says who and what, instead of hanging.

Each test writes a small script and runs it on real ranks (mpiexec, or the
``commrt train`` launcher over gloo).
"""

import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch
from helpers.local_transport import run_ranks

import commrt
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator


def _mpiexec(tmp_path, n, body, *, env=None, timeout=120):
    script = tmp_path / "job.py"
    script.write_text("import os, signal, sys, time\nimport torch, commrt\n" + body)
    cmd = [shutil.which("mpiexec"), "-n", str(n), sys.executable, str(script)]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {})),
    )
    return proc, time.monotonic() - t0


@pytest.mark.mpi
@pytest.mark.slow
def test_a_stopped_rank_ends_the_whole_job(tmp_path):
    # rank 1 stops (SIGSTOP) after one collective; rank 0 times out, and its uncaught
    # error ends the job through MPI_Abort instead of hanging in MPI's shutdown
    timeout = 10
    proc, elapsed = _mpiexec(
        tmp_path,
        2,
        f"""
comm = commrt.init(timeout={timeout})
t = torch.ones(1000)
commrt.all_reduce(t, comm)
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
commrt.all_reduce(t, comm)
""",
        timeout=timeout + 60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert elapsed <= timeout + 15, (elapsed, out)
    assert "rank 0 timed out after 10 s waiting for recv from rank 1" in out, out
    assert "ending the whole job" in out


@pytest.mark.mpi
def test_debug_mode_names_a_size_mismatch_on_every_rank(tmp_path):
    proc, _ = _mpiexec(
        tmp_path,
        2,
        """
comm = commrt.init(timeout=60)
t = torch.ones(1000 if comm.rank == 0 else 7)
t0 = time.monotonic()
try:
    commrt.all_reduce(t, comm, op="sum")
except commrt.CommError as e:
    # one write per line: print() writes the text and the newline apart, and mpiexec may
    # interleave the two ranks' output between them
    sys.stdout.write(f"rank {comm.rank} raised after {time.monotonic() - t0:.3f} s: {e}\\n")
""",
        env={"COMMRT_DEBUG": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if " raised after " in ln]
    assert sorted(ln.split()[1] for ln in lines) == ["0", "1"], proc.stdout
    for ln in lines:
        assert float(re.search(r"after ([\d.]+) s", ln).group(1)) < 2.0, ln
        assert "shape=[1000]" in ln and "shape=[7]" in ln, ln


@pytest.mark.mpi
def test_without_debug_a_truncated_message_says_sizes_differ_and_the_job_ends(tmp_path):
    proc, elapsed = _mpiexec(
        tmp_path,
        2,
        """
comm = commrt.init(timeout=60)
commrt.all_reduce(torch.ones(1000 if comm.rank == 0 else 7), comm)
""",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and elapsed < 50, (elapsed, out)  # not the 60 s timeout
    assert "the ranks called collectives of different sizes" in out, out


@pytest.mark.mpi
def test_a_ctrl_c_in_a_script_is_named_as_one_and_ends_the_job(tmp_path):
    # rank 0 is interrupted while rank 1 waits in a collective: the hook ends the job at
    # once, and its line calls it an interrupt (it said "uncaught KeyboardInterrupt: ;")
    proc, elapsed = _mpiexec(
        tmp_path,
        2,
        """
comm = commrt.init(timeout=60)
if comm.rank == 0:
    raise KeyboardInterrupt
commrt.all_reduce(torch.ones(8), comm)
""",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and elapsed < 50, (elapsed, out)  # not the 60 s timeout
    assert "commrt: rank 0: interrupted (Ctrl-C or SIGINT); ending this rank" in out, out
    assert "KeyboardInterrupt: ;" not in out, out


@pytest.mark.mpi
def test_abort_on_error_can_be_turned_off(tmp_path):
    # the error stays an ordinary Python exception: the script catches nothing, exits 1 on
    # the rank that raised, and the other rank finishes normally
    proc, _ = _mpiexec(
        tmp_path,
        2,
        """
comm = commrt.init(timeout=60)
assert sys.excepthook is sys.__excepthook__
if comm.rank == 0:
    raise SystemExit(0)
""",
        env={"COMMRT_ABORT_ON_ERROR": "0"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tensors_that_require_grad_are_rejected_up_front():
    def body(tr):
        comm = Communicator(
            tr, Backend.GLOO, LaunchInfo("none", tr.rank, tr.world_size, 0, None), 5, 1 << 20
        )
        w = torch.ones(4, requires_grad=True)
        with pytest.raises(ValueError, match="requires grad.*detach"):
            commrt.all_reduce(w, comm)
        with pytest.raises(ValueError, match="requires grad"):
            commrt.broadcast(w, comm)
        commrt.all_reduce(w.detach(), comm)  # the suggested fix works
        return True

    assert run_ranks(2, body) == [True, True]


@pytest.mark.mpi
def test_a_job_ended_by_mpi_abort_leaves_no_mpich_segment_in_dev_shm(tmp_path):
    # each rank says which mpich segment it maps; the uncaught error ends the job through
    # MPI_Abort, which would leave that file behind
    proc, _ = _mpiexec(
        tmp_path,
        2,
        """
comm = commrt.init(timeout=60)
maps = {line.split(None, 5)[-1].strip() for line in open("/proc/self/maps")}
print("maps", *sorted(m for m in maps if m.startswith("/dev/shm/mpich_shm_")), flush=True)
comm.barrier()
if comm.rank == 0:
    raise commrt.CommError("rank 0 gives up")
time.sleep(30)
""",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "ending the whole job" in out, out
    segments = {p for line in out.splitlines() if line.startswith("maps") for p in line.split()[1:]}
    assert segments, out  # mpich made one (ranks of one node)
    assert not [p for p in segments if os.path.exists(p)], segments
