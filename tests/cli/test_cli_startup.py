"""commrt train's start-up: measured from commrt's own start, not the process's (a shell
that slept and then exec'd commrt shares its process, and the sleep is none of commrt's
start-up: a new user saw a 14.4 s start-up after ``sleep 10``); its phases, rank 0 naming
a phase still running once the start-up is slow (commrt.cli.startup); the digits read
without importing scikit-learn."""

import io
import os
import subprocess
import sys
import time

import pytest
import torch

from commrt.cli.startup import Startup, launcher_line
from commrt.cli.train_data import load_digits

SLEEP_S = 4.0
PROBE = (
    "import time; import commrt; from commrt.cli.launch import launched_at; "
    "print(time.time() - launched_at())"
)


def test_a_sleep_before_commrt_is_not_in_its_start_up():
    env = {k: v for k, v in os.environ.items() if k != "COMMRT_LAUNCHED_AT"}
    # exec: the interpreter takes over the shell's process, as bash -c does for its last
    # command, so the process started SLEEP_S before commrt did
    shell = f"sleep {SLEEP_S} && exec {sys.executable} -c '{PROBE}'"
    out = subprocess.run(
        ["bash", "-c", shell], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    since = float(out.stdout.split()[-1])
    assert 0 <= since < SLEEP_S, out.stdout


def test_a_phase_still_running_once_the_start_up_is_slow_is_named_once():
    out = io.StringIO()
    launched = time.time()
    s = Startup(launched, say=True, stream=out, slow_s=1.0)
    s.begin("quick", now=launched)  # ends well before the start-up is slow: never named
    time.sleep(0.05)
    s.begin("slow")  # still running at 1 s: named then, with the seconds since the launch
    time.sleep(1.5)
    s.begin("late")  # begins after 1 s: named at once
    time.sleep(0.05)
    took = s.end()
    lines = out.getvalue().splitlines()
    assert [line.split("s  ", 1)[1] for line in lines] == ["slow…", "late…"], lines
    phases = dict(s.breakdown())
    assert list(phases) == ["quick", "slow", "late"]
    assert 1.0 <= float(lines[0].split()[0]) <= phases["quick"] + phases["slow"] + 0.05, lines
    assert phases["slow"] >= 1.5 and abs(sum(phases.values()) - took) < 1e-6


def test_a_phase_someone_named_is_not_named_again_and_other_ranks_say_nothing():
    out = io.StringIO()
    first = Startup(time.time() - 5, say=True, stream=out, slow_s=0.1)
    first.begin("processes and imports", now=first.launched, named=True)
    time.sleep(0.2)
    first.end()
    other = Startup(time.time() - 5, say=False, stream=out, slow_s=0.1)
    other.begin("meeting the other ranks")
    time.sleep(0.2)
    other.end()
    assert out.getvalue() == ""
    assert first.breakdown()[0][1] >= 5.0  # from the launch


def test_the_launcher_names_the_first_phase():
    assert launcher_line(2, "shm") == "starting 2 ranks (shm): processes and imports…"


def test_the_digits_are_scikit_learns_own_without_importing_it():
    sklearn = pytest.importorskip("sklearn.datasets", reason="the train extra")
    ours, theirs = load_digits(seed=3), sklearn.load_digits()
    x = torch.cat([ours.x_train, ours.x_test])
    y = torch.cat([ours.y_train, ours.y_test])
    want_x = torch.tensor(theirs.data, dtype=torch.float32) / 16.0
    order = torch.randperm(len(want_x), generator=torch.Generator().manual_seed(3))
    order = torch.cat([order[len(ours.x_test) :], order[: len(ours.x_test)]])
    assert torch.equal(x, want_x[order]) and torch.equal(y, torch.tensor(theirs.target)[order])
