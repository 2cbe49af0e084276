"""A worker killed with SIGKILL under ``commrt train``: the cause comes first, in one line
with the rank, the signal, the algorithm, the bucket and the training step; the
survivors' tracebacks only with --verbose (a new user saw 79 lines of traceback first)."""

import os
import re
import signal

import pytest
from helpers.cli import rank_pid, run_commrt, start_commrt, statements

TRAIN = ("train", "--nproc", "2", "--backend", "gloo", "--epochs", "1", "--quiet")


def test_a_killed_worker_is_named_first_in_one_statement_within_80_columns():
    proc = run_commrt(*TRAIN, "--kill", "1:3")
    assert proc.returncode != 0
    lines = statements(proc.stderr)
    assert max(map(len, proc.stderr.splitlines())) <= 80, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith("commrt: rank 1 was killed by SIGKILL at training step 3"), lines
    assert "algorithm ring" in lines[0] and "bucket 0" in lines[0], lines
    assert lines[-1].startswith("commrt: stopped the other ranks"), lines
    assert len(lines) == 3, lines


@pytest.mark.slow
def test_verbose_keeps_the_survivors_traceback():
    proc = run_commrt(*TRAIN, "--kill", "1:3", "--verbose")
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr
    assert "commrt: rank 1 was killed by SIGKILL" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the rank's process in /proc")
def test_a_stopped_worker_is_named_with_the_step_its_peers_timed_out_in():
    """A stopped rank keeps its connections open, so its peers learn of it only at their
    timeout; the launcher names it first, with where they were, within 80 columns."""
    argv = [*TRAIN[:-1], "--epochs", "40", "--timeout", "3"]
    proc = start_commrt(*argv)
    try:
        for line in proc.stdout:  # training has begun once an epoch ended
            if line.startswith("epoch 1/40"):
                break
        rank1 = rank_pid(proc.pid, 1)
        assert rank1 is not None
        os.kill(rank1, signal.SIGSTOP)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    said = statements(err)
    stopped = [n for n, s in enumerate(said) if s.startswith("commrt: rank 1 is stopped")]
    assert stopped, err
    assert re.match(
        r"commrt: rank 1 is stopped \(SIGSTOP or a debugger\), so its peers timed out at "
        r"training step \d+, while rank 0 ran algorithm ring\b",
        said[stopped[0]],
    ), err
    assert said[stopped[0] + 1] == "commrt: rank 0 exited with status 1 after that", err
    assert said[-1].startswith("commrt: stopped the other ranks"), err
    assert max(map(len, err.splitlines())) <= 80, err


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the rank's process in /proc")
def test_a_worker_stopped_before_the_rendezvous_ends_the_job_in_one_line_per_fact():
    """Rank 1 stopped as it starts never meets rank 0, whose wait ends at the timeout with
    how many ranks came, no traceback (torch's said "1/2 clients joined" in one)."""
    argv = [*TRAIN[:-1], "--timeout", "3"]
    proc = start_commrt(*argv)
    try:
        while (rank1 := rank_pid(proc.pid, 1)) is None and proc.poll() is None:
            pass  # as soon as it exists: long before its imports end
        assert rank1 is not None
        os.kill(rank1, signal.SIGSTOP)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    said = statements(err)
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert said[0].startswith("commrt: rank 0 timed out after 3 s at the rendezvous on "), err
    assert "1 of 2 ranks came" in said[0], err
    assert "Raise the timeout with --timeout" in said[0] and "commrt.init" not in err, err
    assert said[1] == "commrt: rank 1 is stopped (SIGSTOP or a debugger), so its peers timed out"
    assert said[2] == "commrt: rank 0 exited with status 1 after that", err
    assert max(map(len, err.splitlines())) <= 80, err
