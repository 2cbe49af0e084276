"""A backup worker left behind: once every other rank of a ``commrt train --algorithm
backup`` job ended well, the launcher gives the ranks still running (at most b) as long
as any wait may take (``--timeout``), then stops them and ends the job with status 0,
instead of waiting forever for a rank that is stopped (SIGSTOP, a debugger) or hung."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.cli import rank_pid, start_commrt

from commrt.cli.tolerance import Lingering


def test_lingering_ranks_are_overdue_only_when_the_job_may_lose_them():
    linger = Lingering(tolerate=1, linger_s=0.2)
    assert linger.overdue([None, None, None]) == []  # all still running
    assert linger.overdue([0, None, -9]) == []  # two would be lost: not this policy's call
    assert linger.overdue([0, None, 0]) == []  # the clock starts
    time.sleep(0.3)
    assert linger.overdue([0, None, 0]) == [1]
    assert linger.overdue([0, 0, 0]) == [] and linger.since is None  # it ended by itself
    assert Lingering(1, None).overdue([0, None, 0]) == []  # no limit: wait as before


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the rank's process in /proc")
def test_a_stopped_backup_worker_does_not_keep_the_job_waiting():
    argv = ["train", "--nproc", "3", "--backend", "gloo", "--algorithm", "backup"]
    argv += ["--epochs", "40", "--timeout", "4", "--verbose"]  # a failure shows why
    proc = start_commrt(*argv, stderr=subprocess.STDOUT)
    lines = []
    try:
        for line in proc.stdout:  # training has begun once an epoch ended
            lines.append(line)
            if line.startswith("epoch 1/40"):
                break
        rank1 = rank_pid(proc.pid, 1)
        assert rank1 is not None, "".join(lines)
        os.kill(rank1, signal.SIGSTOP)
        stopped_at = time.monotonic()
        out = "".join(lines) + proc.stdout.read()
        assert proc.wait(timeout=300) == 0, out
    finally:
        proc.kill()
    assert "commrt: rank 1 was still running 4 s after the other ranks ended" in out, out
    assert "commrt: (it is stopped: SIGSTOP or a debugger); the launcher stopped it" in out
    assert "missing ranks                1" in out and "commrt train: done" in out, out
    assert max(map(len, out.splitlines())) <= 80, out
    with pytest.raises(ProcessLookupError):
        os.kill(rank1, 0)  # gone, not left stopped
    sys.stdout.write(f"ended {time.monotonic() - stopped_at:.1f} s after the SIGSTOP\n")
