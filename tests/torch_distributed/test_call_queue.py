"""Where a group's calls run: a call the caller would only wait for (synchronous, or small
inside DDP's backward) runs on the caller's thread when nothing is ahead of it; any other
call, or one behind a queued call, runs on the call thread, in the order submitted."""

import threading

import torch

from commrt.distributed import group as G
from commrt.distributed.work import CallQueue, CommrtWork


def _work(name: str) -> CommrtWork:
    return CommrtWork(name, 0, [], 30.0)


def test_a_call_that_may_run_here_runs_on_the_callers_thread_when_idle():
    calls, ran = CallQueue("calls"), []
    try:
        here = calls.submit(
            lambda: ran.append(threading.current_thread().name), _work("a"), here=True
        )
        assert here.is_completed() and ran == ["MainThread"]  # done before submit returned
        calls.submit(lambda: ran.append(threading.current_thread().name), _work("b")).wait()
        assert ran == ["MainThread", "calls"] and calls.pending == 0
    finally:
        calls.close()


def test_a_call_behind_a_queued_one_waits_its_turn_on_the_call_thread():
    calls, ran = CallQueue("calls"), []
    gate = threading.Event()
    try:
        first = calls.submit(lambda: (gate.wait(10), ran.append("first")), _work("first"))
        second = calls.submit(
            lambda: ran.append(("second", threading.current_thread().name)),
            _work("second"),
            here=True,
        )
        assert not second.is_completed()  # queued behind the first, not run here
        gate.set()
        first.wait()
        second.wait()
        assert ran == ["first", ("second", "calls")]
    finally:
        calls.close()


def test_an_error_of_a_call_run_here_reaches_its_waiter_and_keeps_the_queue_going():
    calls = CallQueue("calls")
    try:
        work = _work("bad")
        with work.lock:
            work.waited = True  # a synchronous call: torch waits on it

        def bad():
            raise ValueError("bad input")

        calls.submit(bad, work, here=True)
        assert isinstance(work.exception(), ValueError) and calls.pending == 0
        assert calls.submit(lambda: None, _work("next"), here=True).is_success()
    finally:
        calls.close()


def test_only_small_calls_inside_backward_count_as_waited_for():
    small, big = [torch.zeros(16)], [torch.zeros(G.HERE_BYTES // 4 + 1)]
    assert not G._small_in_backward(small)  # outside backward: DDP may overlap it
    seen = []
    x = torch.ones(2, requires_grad=True)
    x.register_hook(lambda g: seen.append((G._small_in_backward(small), G._small_in_backward(big))))
    (x * 2).sum().backward()
    assert seen == [(True, False)]
