"""Torch threads where ranks share cores (commrt.process.threads): the share each rank gets, left
alone when OMP_NUM_THREADS is set, and what a real gloo launch by hand gets from init."""

import re

import pytest
import torch
from helpers.mp import gloo_ranks

from commrt.process import threads
from commrt.process.threads import fit_torch_threads, threads_for


@pytest.mark.parametrize(
    "local, had, cores, want",
    [
        (4, 2, 2, 1),  # the case measured: 8 threads on 2 cores
        (2, 2, 2, 1),
        (2, 16, 16, 8),
        (3, 16, 16, 5),
        (2, 1, 2, None),  # fits
        (8, 1, 2, None),  # oversubscribed, but one thread each is the least
        (1, 64, 2, None),  # one rank on the node
        (None, 64, 2, None),  # the launcher did not say
    ],
)
def test_each_rank_gets_its_share_of_the_cores(local, had, cores, want):
    assert threads_for(local, had, cores) == want


def test_fit_sets_torch_threads_and_warns_once_unless_omp_num_threads_is_set(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    try:
        torch.set_num_threads(4)
        assert fit_torch_threads(4, env={"OMP_NUM_THREADS": "4"}) is None
        assert torch.get_num_threads() == 4
        with pytest.warns(RuntimeWarning, match="4 ranks share this node's 4 cores.*set to 1"):
            assert fit_torch_threads(4, env={}) == 1
        assert torch.get_num_threads() == 1
        assert fit_torch_threads(4, env={}) is None  # already fits: no second warning
    finally:
        torch.set_num_threads(before)


def _lines(out: str) -> dict[int, tuple[int, int, int]]:
    found = re.findall(r"rank (\d) had (\d+) now (\d+) warned (\d)", out)
    return {int(r): (int(h), int(n), int(w)) for r, h, n, w in found}


@pytest.mark.parametrize("how", ["init", "dist"])
def test_a_launch_by_hand_gets_one_thread_share_per_rank_and_one_warning(how):
    """Ranks started with RANK/WORLD_SIZE/LOCAL_WORLD_SIZE only (no OMP_NUM_THREADS, as a
    batch script might) ran a 1 MiB all-reduce 8-20x slower with a thread per core each;
    through commrt.init and through init_process_group("commrt") alike."""
    codes, outs = gloo_ranks(2, "threads_worker.py", how, drop_env=("OMP_NUM_THREADS",))
    assert codes == [0, 0], outs
    got = _lines("".join(outs))
    assert sorted(got) == [0, 1], outs
    share = max(1, threads.usable_cores() // 2)
    for had, now, warned in got.values():
        assert (now, warned) == (share, 1), outs
        assert had > now


def test_omp_num_threads_set_keeps_the_users_threads():
    codes, outs = gloo_ranks(2, "threads_worker.py", "init")  # its OMP_NUM_THREADS=1
    assert codes == [0, 0], outs
    for had, now, warned in _lines("".join(outs)).values():
        assert (now, warned) == (had, 0), outs


@pytest.mark.parametrize(
    "thread",
    ["call", "p2p", *(pytest.param(t, marks=pytest.mark.slow) for t in ("progress", "gossip"))],
)
def test_a_program_that_ends_while_a_thread_is_in_a_gloo_call_exits_with_its_own_code(thread):
    """Rank 0 leaves main (``sys.exit(3)``) while one of commrt's threads is in gloo: the
    torch backend's call thread (an async all-reduce), its point-to-point helper (an
    ``irecv``'s ``get_future()``), GradientSync's progress thread, or gossip's waiter.
    Rank 1 joins that call only while rank 0's interpreter finalizes. As daemons, each of
    the four came back from C++ then and aborted the process (``terminate called without
    an active exception``, exit -6); as background threads the exit waits for the call."""
    codes, outs = gloo_ranks(2, "exit_mid_call_worker.py", thread, timeout=60)
    joined = "\n".join(outs)
    assert codes == [3, 0], joined
    assert "rank 0 leaves main" in outs[0] and "rank 1 done" in outs[1], joined
    assert "terminate called" not in joined and "Fatal Python error" not in joined, joined


def test_next_job_runs_what_was_queued_and_ends_once_the_program_has(monkeypatch):
    import queue

    jobs = queue.SimpleQueue()
    jobs.put("queued")
    monkeypatch.setattr(threads, "IDLE_CHECK_S", 0.01)
    monkeypatch.setattr(threads, "program_ending", lambda: True)
    assert threads.next_job(jobs) == "queued"
    assert threads.next_job(jobs) is None


def test_idle_wait_ends_an_idle_loop_once_the_program_has(monkeypatch):
    import threading

    cv = threading.Condition()
    monkeypatch.setattr(threads, "IDLE_CHECK_S", 0.01)
    with cv:
        assert threads.idle_wait(cv)  # the program runs: look again
        monkeypatch.setattr(threads, "program_ending", lambda: True)
        assert not threads.idle_wait(cv)  # ended, nothing notified: the loop ends
