"""What the launcher says when a job fails (:func:`~commrt.cli.launch.what_happened`):
the cause first (a rank killed or stopped), then the ranks that followed it, each with
its own error only where that error blames another rank (something else happened there)
or no cause is known."""

import json
import signal

import pytest

from commrt.cli import launch


class Proc:
    def __init__(self, pid, code):
        self.pid, self.code = pid, code

    def poll(self):
        return self.code


@pytest.fixture
def told(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "stopped_now", lambda pid: pid == 101)

    def write(**report):
        (tmp_path / f"{report['rank']}.json").write_text(json.dumps(report))

    return write, str(tmp_path)


def test_a_stopped_rank_is_named_with_where_its_peers_were(told):
    reports, folder = told
    reports(rank=0, step=23, peers=[1], where="algorithm ring, bucket 0", error="E: x")
    lines, code = launch.what_happened([Proc(100, 1), Proc(101, None)], folder)
    assert lines == [
        "rank 1 is stopped (SIGSTOP or a debugger), so its peers timed out at training "
        "step 23, while rank 0 ran algorithm ring, bucket 0",
        "rank 0 exited with status 1 after that",
        "stopped the other ranks of this 2-rank job",
    ]
    assert code == 1


def test_a_rank_that_blames_another_than_the_cause_says_its_error(told):
    reports, folder = told
    reports(rank=0, step=5, peers=[1], error="CommTimeoutError: rank 1 never arrived")
    reports(rank=2, step=5, peers=[0], error="RankDeclaredDeadError: rank 2 was declared dead")
    procs = [Proc(100, 1), Proc(101, None), Proc(102, 1)]
    lines, _ = launch.what_happened(procs, folder)
    assert lines[1:3] == [
        "rank 0 exited with status 1 after that",
        "rank 2 exited with status 1 after that: RankDeclaredDeadError: rank 2 was declared dead",
    ]


def test_with_no_cause_known_each_failed_rank_says_its_error(told):
    reports, folder = told
    reports(rank=1, step=2, peers=[None], error="CommError: the transport failed")
    lines, code = launch.what_happened([Proc(100, 0), Proc(103, 3)], folder)
    assert lines[0] == "rank 1 exited with status 3: CommError: the transport failed"
    assert code == 3


def test_a_killed_rank_comes_first_and_its_exit_code_is_the_shells(told):
    reports, folder = told
    reports(rank=0, step=3, peers=[1], where="algorithm ring, bucket 0", error="E: reset")
    lines, code = launch.what_happened([Proc(100, 1), Proc(104, -signal.SIGKILL)], folder)
    assert lines[:2] == [
        "rank 1 was killed by SIGKILL at training step 3, while rank 0 ran algorithm ring, "
        "bucket 0",
        "rank 0 exited with status 1 after that",
    ]
    assert code == 128 + signal.SIGKILL
