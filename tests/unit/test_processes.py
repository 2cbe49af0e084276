"""commrt.transports.processes: whether a process on this host has ended or is stopped,
read from /proc, one rule each for the shared-memory transport, the stall watch and the
launcher."""

import os
import signal
import subprocess
import sys
import time

from commrt.transports import processes


def _child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def _until(predicate, seconds=10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_a_running_process_is_neither_gone_nor_stopped():
    assert not processes.gone(os.getpid()) and not processes.stopped(os.getpid())
    assert processes.start_time(os.getpid()) is not None


def test_a_stopped_process_is_stopped_and_not_gone():
    child = _child()
    try:
        child.send_signal(signal.SIGSTOP)
        assert _until(lambda: processes.stopped(child.pid))
        assert not processes.gone(child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_dead_process_is_gone_before_and_after_it_is_reaped():
    child = _child()
    started = processes.start_time(child.pid)
    child.kill()
    assert _until(lambda: processes.gone(child.pid))  # a zombie: dead, not yet reaped
    assert processes.start_time(child.pid) is None and started is not None
    child.wait()
    assert processes.gone(child.pid) and not processes.stopped(child.pid)


def test_the_rule_reads_the_state_letter():
    assert processes.ended(None) and processes.ended("Z") and processes.ended("X")
    assert not processes.ended("S") and not processes.ended("T")
