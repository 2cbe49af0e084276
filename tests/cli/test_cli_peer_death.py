"""A worker killed with SIGKILL under ``commrt train``: the cause comes first, in one line
with the rank, the signal, the algorithm, the bucket and the training step; the
survivors' tracebacks only with --verbose (a new user saw 79 lines of traceback first)."""

import pytest
from helpers.cli import run_commrt

TRAIN = ("train", "--nproc", "2", "--backend", "gloo", "--epochs", "1", "--quiet")


def test_a_killed_worker_is_named_first_in_one_line():
    proc = run_commrt(*TRAIN, "--kill", "1:3")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
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
