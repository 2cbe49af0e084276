"""Where a group's calls run: a call the caller would only wait for (synchronous, or small
inside DDP's backward) runs on the caller's thread when nothing is ahead of it; any other
call, or one behind a queued call, runs on the call thread, in the order submitted."""

import threading
import types

import pytest
import torch
import torch.distributed as dist

from commrt.distributed import dispatch as D
from commrt.distributed.work import CallQueue, CommrtWork
from commrt.process import threads


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


def test_calls_submitted_while_one_runs_here_wait_for_it_then_run_in_order():
    """No lock of the queue's own keeps them apart: they are held until the call that
    runs on its caller's thread ends, then reach the call thread in the order they came."""
    calls, ran = CallQueue("calls"), []
    later = []

    def submit_two():
        later.append(calls.submit(lambda: ran.append("b"), _work("b")))
        later.append(calls.submit(lambda: ran.append("c"), _work("c"), here=True))

    def first():
        t = threading.Thread(target=submit_two)
        t.start()
        t.join(10)
        threading.Event().wait(0.2)  # room for a call thread that would not wait to run
        ran.append("a")

    try:
        calls.submit(first, _work("a"), here=True)
        for work in later:
            work.wait()
        assert ran == ["a", "b", "c"] and calls.pending == 0
    finally:
        calls.close()


def test_an_error_of_a_call_run_here_reaches_its_waiter_and_keeps_the_queue_going():
    calls = CallQueue("calls")
    try:
        work = _work("bad")
        work.mark_waited()  # a synchronous call: torch waits on it

        def bad():
            raise ValueError("bad input")

        calls.submit(bad, work, here=True)
        assert isinstance(work.exception(), ValueError) and calls.pending == 0
        assert calls.submit(lambda: None, _work("next"), here=True).is_success()
    finally:
        calls.close()


def test_only_small_calls_inside_backward_count_as_waited_for():
    small, big = [torch.zeros(16)], [torch.zeros(D.HERE_BYTES // 4 + 1)]
    spare, one = (
        types.SimpleNamespace(one_core_each=False),
        types.SimpleNamespace(one_core_each=True),
    )
    assert not D.here_in_backward(small, spare)  # outside backward: DDP may overlap it
    assert not D.here_in_backward(big, one)
    seen = []
    x = torch.ones(2, requires_grad=True)
    x.register_hook(
        lambda g: seen.append(
            (
                D.here_in_backward(small, spare),
                D.here_in_backward(big, spare),
                D.here_in_backward(big, one),  # a rank with one core: any size
            )
        )
    )
    (x * 2).sum().backward()
    assert seen == [(True, False, True)]


@pytest.mark.parametrize(
    "cores, local, one_each",
    [
        (2, "2", True),
        (1, "1", True),
        (4, "2", False),
        (3, "2", False),
        (16, "2", False),
        (1, None, False),
    ],
)
def test_one_core_a_rank_runs_calls_of_any_size_in_backward_on_the_caller(
    tmp_path, monkeypatch, cores, local, one_each
):
    # 2 ranks on 2 cores: the call thread could only take turns with the backward
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    if local is None:  # the launcher does not say how many ranks share the node
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    monkeypatch.setenv("RANK", "0")  # torchrun's variables, which it sets together
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert threads.one_core_each(None if local is None else int(local)) is one_each
    dist.init_process_group(
        "commrt", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        pg = dist.group.WORLD  # the commrt group itself (an extended-API backend)
        assert pg.devices.one_core_each is one_each
        ran = []
        x = torch.ones(2, requires_grad=True)
        big = torch.ones(D.HERE_BYTES // 4 + 1)

        def in_backward(g):
            work = dist.all_reduce(big, async_op=True)
            ran.append(work.is_completed())  # run here: done before all_reduce returned
            work.wait()

        x.register_hook(in_backward)
        (x * 2).sum().backward()
        assert ran == [one_each]
    finally:
        dist.destroy_process_group()
