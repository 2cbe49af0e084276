"""The suite's CPU report (tests/conftest.py): a test's CPU counts the processes it started
and the ranks its zygote forked, not only its own pytest process's."""

import os
import subprocess
import sys
import time

from conftest import cpu_seconds
from helpers import zygote

#: a process that uses about this much CPU, then exits
BURN_S = 0.5
BURN = f"import time\nwhile time.process_time() < {BURN_S}: pass\n"


def _counted_within(before: float, seconds: float) -> float:
    """The CPU counted since ``before``, once it reaches most of :data:`BURN_S` or
    ``seconds`` pass (a zygote reaps its ranks every 50 ms)."""
    deadline = time.monotonic() + seconds
    while cpu_seconds() - before < 0.9 * BURN_S and time.monotonic() < deadline:
        time.sleep(0.05)
    return cpu_seconds() - before


def test_a_started_process_is_counted_once_it_is_waited_for():
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", BURN], check=True, timeout=60)
    assert _counted_within(before, 5) >= 0.9 * BURN_S


def test_a_rank_forked_by_the_zygote_is_counted(rank_zygote, tmp_path):
    """Through the session's zygote where it runs (the rank is the zygote's child, not
    this process's), as a fresh interpreter where $TEST_FRESH_RANKS is set."""
    script = tmp_path / "burn.py"
    script.write_text("import os\nprint(os.getppid())\n" + BURN)
    env = dict(os.environ, OMP_NUM_THREADS="1")  # as the helpers start ranks: forkable
    before = cpu_seconds()
    run = subprocess.run(
        zygote.command(str(script)), env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    if rank_zygote is not None:
        assert int(run.stdout) == rank_zygote.pid, run.stderr  # forked, not run fresh
    assert _counted_within(before, 5) >= 0.9 * BURN_S
