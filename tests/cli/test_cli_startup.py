"""The summary's times are measured from commrt's own start, not the process's: a shell
that slept and then exec'd commrt shares its process, and the sleep is none of commrt's
start-up (a new user saw a 14.4 s start-up after ``sleep 10``)."""

import os
import subprocess
import sys

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
