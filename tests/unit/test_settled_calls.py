"""The memo of settled calls has one owner, the executor's SettledCalls
(commrt.schedule.caches): every caller asks it, and dropping a call there drops it from
the last run too, so no second copy can run a call its counter gave up."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from commrt.schedule.caches import MAX_SETTLED, Bindings, Run, SettledCalls
from commrt.schedule.executor import Executor


def _call(n: int = 4):
    return SimpleNamespace(key=("ring", "sum", torch.float32, (n,)))


def _memo_whose_last_run_was(call) -> tuple[Bindings, SettledCalls]:
    bindings = Bindings(lambda dst, src: dst.add_(src))
    bindings.memo = Run(None, 0, 4, torch.float32, None, 1 << 20, None, None, True, call)
    return bindings, SettledCalls(bindings)


def test_the_executor_owns_the_memo():
    executor = Executor()
    assert isinstance(executor.settled, SettledCalls) and len(executor.settled) == 0


def test_a_dropped_call_leaves_its_signature_and_the_last_run():
    call = _call()
    bindings, memo = _memo_whose_last_run_was(call)
    assert memo.keep(call) is call and memo.get(call.key) is call
    memo.drop(call)
    assert memo.get(call.key) is None and len(memo) == 0
    assert bindings.memo.call is None  # a repeat on the same tensor cannot find it


def test_dropping_an_old_record_keeps_its_signatures_newer_one():
    old, new = _call(), _call()
    bindings, memo = _memo_whose_last_run_was(new)
    memo.keep(old)
    memo.keep(new)  # another spelling of the same signature replaced it
    memo.drop(old)
    assert memo.get(new.key) is new and bindings.memo.call is new


def test_clear_forgets_every_call_and_the_last_runs():
    calls = [_call(n) for n in range(1, 4)]
    bindings, memo = _memo_whose_last_run_was(calls[-1])
    for call in calls:
        memo.keep(call)
    memo.keeps(("settling",), learns=True, settled=True)
    memo.clear()
    assert len(memo) == 0 and bindings.memo.call is None
    # the settling signature was forgotten too: it waits one call again
    assert memo.keeps(("settling",), learns=True, settled=True) is False


def test_the_memo_is_bounded():
    _, memo = _memo_whose_last_run_was(None)
    for n in range(MAX_SETTLED):
        memo.keep(_call(n))
    assert len(memo) == MAX_SETTLED
    memo.keep(_call(MAX_SETTLED))  # a new signature past the bound: the rest forgotten
    assert len(memo) == 1


def test_a_learning_call_is_kept_on_the_call_after_it_settled():
    _, memo = _memo_whose_last_run_was(None)
    key = _call().key
    assert memo.keeps(key, learns=False, settled=True) is True  # a fixed algorithm: at once
    assert memo.keeps(key, learns=True, settled=False) is False
    assert memo.keeps(key, learns=True, settled=True) is False  # settled on this call
    assert memo.keeps(key, learns=True, settled=True) is True  # kept on the next
