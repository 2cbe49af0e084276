"""auto learns from what it runs (commrt.algorithms.auto_learn), and the probe's sanity
checks and saved calibration (commrt.tuning.probe, commrt.tuning.probe_checks)."""

import json
import math
import re
import warnings

import pytest
from helpers.mp import mpiexec

from commrt.algorithms import Auto
from commrt.algorithms.auto_learn import (
    MAX_BLOCK_CALLS,
    MIN_BLOCK_CALLS,
    RECHECK_MAX_S,
    RECHECK_MIN_CALLS,
    RECHECK_S,
    Tuning,
)
from commrt.algorithms.auto_times import agreed_time, block_time
from commrt.tuning.memory import AutoMemory
from commrt.tuning.probe import ProbeResult
from commrt.tuning.probe_checks import ALPHA_BOUND_S, ProbeWarning, conservative, problems


def unpaced(*args, **kw) -> Tuning:
    """A Tuning that never holds its leader before a pass: the trial's mechanics alone
    (pacing has its own tests in tests/unit/test_auto_converges.py)."""
    return Tuning(*args, explore=math.inf, **kw)


def feed(t: Tuning, times):
    """Drive ``t`` with injected per-call times (every rank alike), as observe() would."""
    for s in times:
        if t.record(s):
            t.advance([t.times])


def play(t: Tuning, times: dict, most: int = 10**4) -> list[str]:
    """Run ``t``'s calls until it settles, a timed call of a label taking ``times[label]``
    on every rank (an untimed warm-up 50.0: it decides nothing); the labels run."""
    ran = []
    while t.phase != "settled" and len(ran) < most:
        ran.append(t.running)
        if t.phase == "hold":
            t.settled_call()
        else:
            feed(t, [times[ran[-1]] if t.timing else 50.0])
    return ran


def test_a_choice_within_its_margin_is_kept_without_a_trial():
    t = unpaced("ring", 1.0, runner_up="torus2d(4x2)", margin=0.25, window=3, warmup=1)
    assert t.running == "ring" and not t.timing  # the first call warms up, untimed
    feed(t, [9.0, 1.2, 1.1, 1.24])
    assert (t.phase, t.kept, t.chosen_s, t.runner_s) == ("settled", "ring", 1.2, None)
    feed(t, [50.0] * 10)  # settled: nothing is timed any more
    assert (t.phase, t.kept, t.times) == ("settled", "ring", [])


def test_a_miss_tries_the_runner_up_beside_the_choice_and_keeps_the_faster():
    t = unpaced("ring", predicted_s=1.0, runner_up="torus2d(4x2)", window=3, warmup=1, block=1)
    feed(t, [9.0, 1.3, 1.4, 1.3])  # median 1.3 > (1 + MARGIN) × predicted
    assert (t.phase, t.running, t.chosen_s) == ("trial", "torus2d(4x2)", 1.3)
    tried, choice = "torus2d(4x2)", "ring"
    turns = play(t, {tried: 1.0, choice: 1.5})
    # passes of blocks, each rotated by one: a warm-up then one timed call each, and
    # an untimed call after a pass's last block
    assert turns == [tried, tried, choice, choice, choice, choice, choice, tried, tried, tried]
    # after one block each nothing is out (one block may have stalled); after two, the
    # choice's fastest block is past WIDE × the leader's median: out, and settled
    assert (t.phase, t.kept, t.running, t.lost) == ("settled", tried, tried, {choice: 1.5})
    assert (t.runner_s, t.beside_s, t.chosen_s) == (1.0, 1.5, 1.3)


def test_the_trial_runs_each_candidate_back_to_back_and_the_second_pass_rotated():
    t = unpaced("rd", 1.0, "t4x2", others=("hd",), window=5, warmup=1, passes=3, block=2)
    feed(t, [9.0] + [3.0] * 5)
    block = lambda label: [(label, False)] + [(label, True)] * 2  # noqa: E731
    # and one untimed call after the last block: nothing timed sits just before the gather
    assert list(t.trial_plan()) == [*block("t4x2"), *block("hd"), *block("rd"), ("rd", False)]
    # each block's first call is its untimed warm-up: a slow first call decides nothing
    times = {"t4x2": 1.0, "hd": 0.8, "rd": 1.2}
    feed(t, [50.0 if not timed else times[label] for label, timed in t.trial_plan()])
    assert t.trial_s == pytest.approx(times) and t.phase == "trial"
    assert list(t.trial_plan()) == [*block("hd"), *block("rd"), *block("t4x2"), ("t4x2", False)]
    play(t, times)
    assert (t.kept, set(t.lost)) == ("hd", {"rd"})  # t4x2 lost by less than WIDE


def test_a_runner_up_that_is_slower_beside_the_choice_loses_the_trial():
    t = unpaced("ring", predicted_s=1.0, runner_up="hd", window=2, warmup=0, margin=0.1, block=1)
    feed(t, [2.0, 2.0])  # baseline
    # hd, ring, then ring untimed; ring, hd, hd untimed; hd, ring, ring untimed
    feed(t, [2.5, 2.1, 9.0, 2.0, 2.6, 9.0, 2.0, 2.2, 9.0])
    assert (t.phase, t.kept, t.running) == ("settled", "ring", "ring")
    assert (t.runner_s, t.beside_s) == (2.5, 2.1)


def test_the_trial_compares_calls_side_by_side_not_with_the_baseline():
    # the machine got busier after the baseline: the choice is slower in the trial too
    t = unpaced("ring", predicted_s=1.0, runner_up="hd", window=1, warmup=0)
    feed(t, [2.0])
    play(t, {"hd": 3.0, "ring": 3.5})
    assert (t.kept, t.runner_s, t.beside_s) == ("hd", 3.0, 3.5)


def test_a_sure_loser_left_out_of_the_price_table_is_still_the_runner_up():
    from commrt.algorithms import Auto
    from commrt.sim import Network

    net = Network.flat(alpha_s=20e-6, beta_s_per_byte=1 / 5e9)
    c = Auto(network=net).choose(64, 1 << 10)
    from commrt.algorithms.auto import _second

    assert _second(c) is not None and _second(c) != c.algorithm


def test_contenders_near_the_choice_are_tried_in_turns_and_the_fastest_kept():
    t = unpaced(
        "rd", 1.0, "t4x2", runner_predicted_s=1.05, others=("hd",), window=2, warmup=1, block=1
    )
    feed(t, [9.0, 1.0, 1.0])  # a close call: tried although the choice met its prediction
    turns = play(t, {"t4x2": 1.25, "hd": 0.75, "rd": 1.05})
    # a warm-up and one timed call each: t4x2, hd, rd, then hd, rd, t4x2 (rotated), each
    # pass ending in an untimed call of its last block's schedule; both out
    first, second = ("t4x2", "hd", "rd"), ("hd", "rd", "t4x2")
    want = [x for x in first for _ in range(2)] + ["rd"]
    want += [x for x in second for _ in range(2)] + ["t4x2"]
    assert turns == want
    assert t.trial_s == {"t4x2": 1.25, "hd": 0.75, "rd": 1.05}
    assert (t.phase, t.kept, t.running) == ("settled", "hd", "hd")


def test_a_choice_much_faster_than_predicted_is_a_miss_too():
    t = unpaced("t4x2", 44.0, "hd", window=1, warmup=0)
    feed(t, [22.0])
    assert t.phase == "trial"
    ok = unpaced("t4x2", 44.0, "hd", window=1, warmup=0)
    feed(ok, [41.0])
    assert (ok.phase, ok.kept) == ("settled", "t4x2")


def test_the_choice_wins_a_tie():
    t = unpaced("ring", 1.0, "hd", window=1, warmup=0)
    feed(t, [2.0])
    play(t, {"ring": 1.5, "hd": 1.5})
    assert (t.kept, t.lost) == ("ring", {})


def test_one_slow_pass_of_the_model_choice_does_not_overturn_it():
    # 4 × 2 hosts at 64 KiB (CI): the model chose rd, the fastest (6.7 ms when timed
    # afterwards); one trial timed it at 16.6 ms beside hd's 13.4 and hd was kept, 1.99×
    t = unpaced("rd", 0.008, "hd", window=5, warmup=1)
    feed(t, [1.0] + [0.0182] * 5)
    feed(t, [{"rd": 0.0166, "hd": 0.0134}[x] for x, _ in t.trial_plan()])
    play(t, {"rd": 0.0067, "hd": 0.0131})  # the median of its blocks discards the slow one
    assert (t.phase, t.kept, t.lost) == ("settled", "rd", {"hd": pytest.approx(1.955, 1e-3)})
    # an overturn that holds on the later blocks stands
    u = unpaced("rd", 0.008, "hd", window=5, warmup=1)
    feed(u, [1.0] + [0.0182] * 5)
    play(u, {"rd": 0.0166, "hd": 0.0134})
    assert (u.phase, u.kept) == ("settled", "hd")


def test_a_tried_candidate_runs_one_schedule_object_from_its_trial_to_its_keeping(monkeypatch):
    # a new schedule object every call of a trial recompiled its plan each time (2.6 ms a
    # call for a 2 × 4 torus) and crowded the executor's plan cache
    import time
    import types

    import torch

    import commrt.algorithms.auto as auto_module
    from commrt.algorithms.auto import choices, learning
    from commrt.algorithms.auto_learn import calls_to_settle
    from commrt.runtime.slots import CommSlots
    from commrt.sim import Network

    monkeypatch.setattr(  # one rank
        auto_module, "agree", lambda comm, t, now: ([t.times], [t.cost.columns(now, t.calls)])
    )
    comm = types.SimpleNamespace(slots=CommSlots(), world_size=8, device=torch.device("cpu"),
                                 fuses_one_shot=False,  # no earlier job's verdicts:
                                 memory=lambda labels: AutoMemory({}, None, writes=False))  # fmt: skip
    a, n = Auto(network=Network.flat(alpha_s=20e-6, beta_s_per_byte=1 / 5e9)), 1 << 16
    model = a.choose(8, n, comm).label
    ran = {}
    for _ in range(calls_to_settle(9)):
        s = a.select(8, n, comm)
        assert a.select(8, n, comm) is s
        name = s.name.removeprefix("auto:")
        ran.setdefault(name, []).append(s)
        # the model's choice runs slow, every other candidate fast: one of them is kept
        a.observe(comm, n, time.perf_counter() - (1.0 if name == model else 1e-3))
        if learning(comm)[n].phase == "settled":
            break
    kept = learning(comm)[n].kept
    assert kept != model and len(ran) >= 2
    for name, schedules in ran.items():
        assert all(x is schedules[0] for x in schedules), name
    assert choices(comm)[n].learned and a.select(8, n, comm) is ran[kept][0]


def test_a_block_is_timed_by_its_slowest_ranks_mean_call_not_its_median_call():
    # a torus grid at 1 MiB on 4 × 2 hosts: calls alternating fast and slow had a median
    # of 20-26 ms and a mean of 28-35, beside a steady 20 ms grid; back to back, the mean
    # is what a kept schedule costs
    t = unpaced("bursty", 1.0, "steady", window=6, warmup=0, passes=2, block=3)
    feed(t, [3.0] * 6)
    calls = {"bursty": [1.0, 1.0, 4.0], "steady": [1.5, 1.5, 1.5]}
    feed(t, [calls[label][i % 3] for i, (label, _) in enumerate(t.trial_plan())])
    assert t.trial_s == {"steady": 1.5, "bursty": 2.0}
    # the slowest rank's mean: rank 1 is slow in this pass
    u = unpaced("a", 1.0, "b", window=2, warmup=0, passes=2, block=1)
    feed(u, [3.0, 3.0])
    u.calls = len(u.trial_plan())
    u.times = [1.0, 2.0]  # this rank: b, a (one call a block)
    u.advance([u.times, [3.0, 4.0]])
    assert u.trial_s == {"b": 3.0, "a": 4.0}


def test_cheap_calls_get_longer_blocks_whose_descheduled_calls_are_left_out():
    # gloo at p = 2 on 2 cores, 8 B: 0.45 ms a call, and 7 % of the calls took 10-15x that;
    # in a block of two timed calls one such call decided the block
    blocks = {}
    for call_s in (1e-5, 4.5e-4, 1e-3, 1.0):
        t = unpaced("rd", call_s / 2, "ring", window=5, warmup=1)
        feed(t, [9.0] + [call_s] * 5)  # a miss: a trial
        blocks[call_s] = [x for x, _ in t.trial_plan()].count("ring") - t.warmup
    assert blocks == {1e-5: MAX_BLOCK_CALLS, 4.5e-4: 5, 1e-3: MIN_BLOCK_CALLS, 1.0: 3}
    # a rank's call over OUTLIER x its median is left out, at most a quarter of them
    assert block_time([[1.0, 1.0, 12.0, 1.0, 1.0], [1.0] * 5]) == 1.0
    assert block_time([[1.0, 12.0, 1.0, 13.0, 1.0]]) == pytest.approx(15 / 4)
    # a schedule whose calls alternate fast and slow keeps its slow ones: that is its pace
    assert block_time([[1.0, 1.0, 4.0] * 2]) == 2.0
    # two calls: nothing left out (the median of the blocks is the guard there)
    assert block_time([[1.0, 12.0]]) == 6.5


def test_cheap_calls_get_more_passes_and_one_stalled_block_decides_nothing():
    # 64 KiB on 2 × 2 hosts: with two blocks each, one stall made a 3 ms schedule's trial
    # time 16.6 ms and auto kept one 2.1× slower
    t = unpaced("rd", 0.010, "t2x2", window=5, warmup=1, budget_s=0.25, block=2)
    feed(t, [1.0] + [0.003] * 5)  # a miss: 3 ms a call, 9 ms a block: 27 fit, 6 passes
    assert (t.phase, t.trial_passes) == ("trial", 6)
    assert [x for x, _ in t.trial_plan()] == ["t2x2"] * 3 + ["rd"] * 3 + ["rd"]
    calls = {"rd": 0.003, "t2x2": 0.006}
    plan = t.trial_plan()
    times = [calls[label] if timed else 1.0 for label, timed in plan]
    times[plan.index(("rd", True))] = 0.045  # a 45 ms stall in rd's first timed block
    feed(t, times)
    assert t.lost == {}  # one block in which a rank was descheduled puts nothing out
    play(t, calls)
    assert (t.phase, t.kept, set(t.lost)) == ("settled", "rd", {"t2x2"})
    # slow calls keep the least passes
    slow = unpaced("rd", 1.0, "t2x2", window=5, warmup=1, budget_s=0.25)
    feed(slow, [9.0] + [0.15] * 5)  # 150 ms a call: 0.45 s a block
    assert (slow.phase, slow.trial_passes) == ("trial", 3)


def test_a_close_trial_runs_on_to_its_most_passes_and_keeps_the_leader():
    # 4 × 2 hosts at 1 MiB: the fastest schedule (20 ms back to back) measured 28 ms in
    # one pass, beside the choice's 27.9, and was not kept
    t = unpaced("t4x2", 40.0, "t2x4", others=("hd",), window=3, warmup=0, passes=3, block=1)
    feed(t, [25.0] * 3)  # baseline: far below its prediction, a miss
    trial = {"t2x4": [20.0, 21.0, 27.9], "hd": [33.0, 34.0, 33.5], "t4x2": [29.0, 30.0, 28.0]}
    while t.phase == "trial":
        feed(t, [trial[label].pop() if timed else 99.0 for label, timed in t.trial_plan()])
    assert t.trial_s == {"t2x4": 21.0, "hd": 33.75, "t4x2": 29.0}  # hd out after two
    assert (t.phase, t.kept, set(t.lost)) == ("settled", "t2x4", {"hd", "t4x2"})
    # a close result at the most passes is decided, not measured again
    u = unpaced("ring", 1.0, "hd", window=1, warmup=0)
    play(u, {"ring": 1.5, "hd": 1.45})
    assert (u.phase, u.kept, u.passes_run) == ("settled", "hd", u.trial_passes)


def test_a_close_call_is_tried_even_when_the_choice_meets_its_prediction():
    t = unpaced("torus2d(2x4)", 1.0, "torus2d(4x2)", runner_predicted_s=1.08, window=1, warmup=0)
    feed(t, [1.0])
    assert t.phase == "trial"
    play(t, {"torus2d(4x2)": 0.9, "torus2d(2x4)": 1.0})
    assert (t.kept, t.runner_s, t.beside_s) == ("torus2d(4x2)", 0.9, 1.0)
    far = unpaced("ring", 1.0, "hd", runner_predicted_s=1.6, window=1, warmup=0)
    feed(far, [1.05])
    assert (far.phase, far.kept) == ("settled", "ring")


def settle_calls(t: Tuning) -> int:
    """Count settled calls on ``t`` until it wants a recheck; how many it took."""
    for n in range(1, 10**6):
        if t.settled_call():
            return n
    raise AssertionError("no recheck")


def test_a_settled_size_is_timed_again_and_waits_twice_as_long_each_time_it_holds():
    t = unpaced("ring", 0.5, "hd", window=2, warmup=0, recheck_after_s=50.0)
    feed(t, [0.5, 0.5])
    assert (t.phase, t.kept) == ("settled", "ring")
    # 50 s of its 0.5 s calls, then the next calls are timed as the baseline was
    assert settle_calls(t) == 100 and (t.phase, t.running, t.timing) == ("recheck", "ring", True)
    feed(t, [0.52, 0.53])  # within the margin of its baseline: kept, and twice the wait
    assert (t.phase, t.kept, t.recheck_s, t.confirmed) == ("settled", "ring", 0.525, 1)
    assert settle_calls(t) == RECHECK_MAX_S / 0.5  # 100 s, over the cap
    # never fewer than RECHECK_MIN_CALLS calls apart, never more than RECHECK_MAX_S
    fast = unpaced("ring", 1e-3, "hd", window=1, warmup=0, recheck_after_s=1e-3)
    feed(fast, [1e-3])
    assert settle_calls(fast) == RECHECK_MIN_CALLS
    slow = unpaced("ring", 1.0, "hd", window=1, warmup=0, recheck_after_s=1e4)
    feed(slow, [1.0])
    assert settle_calls(slow) == RECHECK_MAX_S
    never = unpaced("ring", 1.0, "hd", window=1, warmup=0, recheck_after_s=None)
    feed(never, [1.0])
    assert not any(never.settled_call() for _ in range(10**4)) and never.phase == "settled"


def test_a_kept_schedule_that_slowed_past_its_rival_meets_it_again_on_fresh_blocks():
    # 4 × 2 hosts at 1 MiB: t4x2 won its trial at 18.4 ms beside t2x4's 20.6, then ran at
    # 27 ms in the rounds that followed (its slow mode), 1.35× the other
    t = unpaced("t4x2", 40.0, "t2x4", others=("hd",), window=2, warmup=0, recheck_after_s=1.0)
    feed(t, [19.0, 19.0])  # far below its prediction: a trial
    play(t, {"t4x2": 18.4, "t2x4": 20.6, "hd": 30.0})
    assert (t.phase, t.kept, set(t.lost)) == ("settled", "t4x2", {"hd"})
    settle_calls(t)
    feed(t, [19.5, 20.0])  # still ahead of its rival's 20.6 (by the margin): kept
    assert (t.phase, t.kept, t.confirmed) == ("settled", "t4x2", 1)
    settle_calls(t)
    feed(t, [27.0, 27.5])  # now 1.3× its rival: the two meet again
    assert (t.phase, t.live, t.recheck_s) == ("trial", ("t4x2", "t2x4"), 27.25)
    assert {label for label, _ in t.trial_plan()} == {"t4x2", "t2x4"}
    play(t, {"t4x2": 27.0, "t2x4": 20.5})
    # decided on the fresh blocks alone (the old 18.4 would have kept t4x2 on a median)
    assert (t.phase, t.kept, t.confirmed) == ("settled", "t2x4", 0)
    assert t.trial_s == {"t4x2": 27.0, "t2x4": 20.5, "hd": 30.0}
    assert "kept t2x4, rechecked at 27250.00 ms" in str(t)
    # its wait starts again from recheck_after_s, at the new kept's pace
    assert settle_calls(t) == RECHECK_MIN_CALLS


def test_a_recheck_times_the_overturned_model_choice_afresh_where_that_is_cheap():
    # 4 × 2 hosts at 64 KiB on a loaded machine: recursive doubling (the model's choice)
    # timed 27 ms in every pass of its trial, 12 ms afterwards; hd was kept at 22 ms
    t = unpaced("rd", 0.008, "hd", window=5, warmup=1, recheck_after_s=1.0, block=2)
    feed(t, [1.0] + [0.02] * 5)
    play(t, {"rd": 0.027, "hd": 0.022})
    assert (t.phase, t.kept, t.lost) == ("settled", "hd", {})
    settle_calls(t)
    feed(t, [0.022] * 6)  # hd as before, not slower than rd's old time: rd is timed again
    assert (t.phase, t.live, t.recheck_s) == ("trial", ("hd", "rd"), 0.022)
    play(t, {"rd": 0.012, "hd": 0.022})
    assert (t.phase, t.kept) == ("settled", "rd") and t.trial_s["rd"] == pytest.approx(0.012)
    # where the choice's calls are dear (3 passes of 3 one-second calls, past the 0.25 s
    # budget), the recheck times the kept schedule alone
    big = unpaced("rd", 0.5, "hd", window=5, warmup=1, recheck_after_s=1.0)
    feed(big, [9.0] + [1.0] * 5)
    play(big, {"rd": 1.2, "hd": 1.0})
    settle_calls(big)
    feed(big, [1.0] * 6)
    assert (big.phase, big.kept, big.confirmed) == ("settled", "hd", 1)


def test_a_choice_settled_without_a_trial_gets_one_when_it_drifts_from_its_baseline():
    t = unpaced("ring", 1.0, "hd", window=2, warmup=0, recheck_after_s=1.0)
    feed(t, [1.0, 1.0])
    assert (t.phase, t.trial_s) == ("settled", {})
    settle_calls(t)
    feed(t, [1.5, 1.6])  # 1.5× its baseline: the model's order is tried again
    assert (t.phase, t.live) == ("trial", ("hd", "ring"))
    play(t, {"hd": 1.1, "ring": 1.55})
    assert (t.phase, t.kept) == ("settled", "hd")
    # with nothing to try, a slower choice is simply kept
    alone = unpaced("ring", 1.0, None, window=1, warmup=0, recheck_after_s=1.0)
    feed(alone, [1.0])
    settle_calls(alone)
    feed(alone, [5.0])
    assert (alone.phase, alone.kept) == ("settled", "ring")


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "2", True])
def test_auto_rejects_a_recheck_that_is_not_a_positive_number_of_seconds(bad):
    with pytest.raises(ValueError, match="recheck_s"):
        Auto(recheck_s=bad)
    assert Auto(recheck_s=None).recheck_s is None and Auto().recheck_s == RECHECK_S


def test_nothing_to_try_without_a_runner_up():
    t = unpaced("ring", predicted_s=1.0, runner_up=None, window=2, warmup=0)
    feed(t, [5.0, 5.0])
    assert (t.phase, t.kept) == ("settled", "ring")


def test_the_agreed_time_is_the_median_of_each_calls_slowest_rank():
    # rank 1 is slow in calls 0 and 1: each call ends with its last rank
    table = [[1.0, 1.0, 1.0], [3.0, 4.0, 1.0]]
    assert agreed_time(table) == 3.0
    assert agreed_time([[1.0, 100.0, 1.0]]) == 1.0  # one burst does not move the median


def _two_tier(**kw):
    m = dict(alpha_s=1e-4, beta_s_per_byte=2e-9, inter_alpha_s=2e-4, inter_beta_s_per_byte=8e-9)
    return m | kw


def test_sanity_checks_name_the_tier_and_the_numbers():
    assert problems(_two_tier()) == []
    inverted = problems(_two_tier(beta_s_per_byte=1.05e-8, inter_beta_s_per_byte=9.4e-9))
    assert [tiers for tiers, _ in inverted] == [("intra", "shared")]
    assert "1.05e-08 > 9.4e-09" in inverted[0][1]
    slow = problems(_two_tier(inter_alpha_s=2 * ALPHA_BOUND_S))
    assert [tiers for tiers, _ in slow] == [("shared",)] and "between nodes" in slow[0][1]
    flat = problems(dict(alpha_s=2 * ALPHA_BOUND_S, beta_s_per_byte=1e-9))
    assert [tiers for tiers, _ in flat] == [("flat",)]


def test_an_inconsistency_that_stays_is_warned_and_priced_at_the_slower_tier():
    m = _two_tier(beta_s_per_byte=1.05e-8, inter_beta_s_per_byte=9.4e-9)
    with pytest.warns(ProbeWarning, match="inside a node measured slower"):
        out = conservative(m, problems(m))
    assert out["beta_s_per_byte"] == out["inter_beta_s_per_byte"] == 1.05e-8
    assert len(out["warnings"]) == 1 and "both tiers priced" in out["warnings"][0]
    m = _two_tier(alpha_s=2 * ALPHA_BOUND_S)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = conservative(m, problems(m))
    assert out["alpha_s"] == 2 * ALPHA_BOUND_S and "priced as measured" in str(seen[0].message)


def _result(**kw):
    base = dict(
        alpha_s=1e-4,
        beta_s_per_byte=1e-9,
        sizes=(8, 1 << 20),
        step_s=(1e-4, 1e-3),
        per_rank=((1e-4, 1e-9), (1e-4, 1e-9)),
        backend="gloo",
        world_size=8,
        seconds=1.0,
        ranks_per_node=2,
        inter_alpha_s=2e-4,
        inter_beta_s_per_byte=8e-9,
        warnings=("probe: something",),
    )
    return ProbeResult(**(base | kw))


def test_a_saved_calibration_loads_as_it_was_and_checks_the_job(tmp_path):
    r = _result()
    path = r.save(tmp_path / "calib.json")
    back = ProbeResult.load(path)
    assert back == r and back.network() == r.network()
    back.check_matches(8, 2, "gloo")
    with pytest.raises(ValueError, match="taken on 8 ranks, 2 per node, over gloo; this job has 4"):
        back.check_matches(4, 2, "gloo")
    with pytest.raises(ValueError, match="1 per node"):
        back.check_matches(8, None, "gloo")
    with pytest.raises(ValueError, match="over mpi"):
        back.check_matches(8, 2, "mpi")
    (tmp_path / "bad.json").write_text(json.dumps({"alpha_s": 1}))
    with pytest.raises(ValueError, match="bad.json is not a saved commrt probe"):
        ProbeResult.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="not a saved commrt probe"):
        ProbeResult.load(tmp_path / "missing.json")


@pytest.mark.mpi
def test_ranks_learn_alike_from_the_slowest_rank_and_reuse_a_saved_calibration(tmp_path):
    out, calib = tmp_path / "learn.json", tmp_path / "calib.json"
    mpiexec(4, "auto_learn_worker.py", out, calib)
    ranks = json.loads(out.read_text())["ranks"]
    assert [f for r in ranks for f in r["failures"]] == []
    # priced on a network 1000× too fast, the choice misses: its runner-up was tried
    tuning = ranks[0]["tuning"]
    assert tuning[0] == "settled" and tuning[5] is not None
    tried = tuning[6]  # every tried candidate's agreed time, the choice's included
    assert tuning[1] in tried and tuning[2] in tried
    assert tried[tuning[3]] == min(tried.values())  # the fastest kept
    # rank 1 slept 50 ms in 3 of the 5 timed baseline calls: the agreed median is the slow rank's
    assert tuning[4] >= 0.05
    assert all(r["tuning"] == tuning and r["choice"] == ranks[0]["choice"] for r in ranks)
    assert ranks[0]["choice"] == [tuning[3], tuning[3] != tuning[1]]
    # Auto(calibration=...) used the saved file instead of probing
    assert all(r["loaded_probe"] == r["saved_probe"] for r in ranks)


@pytest.mark.mpi
def test_learning_times_the_calls_the_memo_runs(tmp_path):
    # a learning call on the full path (resolve, check, select, observe) cost 37-100 µs
    # more than a settled one at 4 ranks on 2 cores: a phase's calls that run one schedule
    # go through the memo after their first two, and its timer observes them
    out = tmp_path / "memo.json"
    mpiexec(2, "auto_memo_worker.py", out)
    ranks = json.loads(out.read_text())["ranks"]
    assert [f for r in ranks for f in r["failures"]] == []
    r0 = ranks[0]
    # the model's choice slept 2 ms a call, on the memo's path too: the trial saw it
    assert r0["kept"] != r0["model"] and r0["trial_s"][r0["model"]] >= 0.002, r0
    assert all({**r, "rank": 0} == r0 for r in ranks)  # every rank decided alike
    learning = [(phase, label, memo) for phase, label, memo in r0["calls"]]
    runs, last = [], None  # runs of one schedule's calls within the baseline or trial
    for phase, label, memo in learning:
        if phase not in ("baseline", "trial"):
            last = None
            continue
        if (phase, label) != last:
            runs.append([])
        runs[-1].append(memo)
        last = (phase, label)
    assert runs and sum(map(sum, runs)) > len(runs), r0["calls"]
    assert all(len(run) - sum(run) <= 2 for run in runs), runs


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["memo", "debug"])
@pytest.mark.slow
def test_auto_moves_on_when_the_schedule_it_kept_slows_down(tmp_path, mode):
    out = tmp_path / "drift.json"
    mpiexec(4, "auto_drift_worker.py", out, mode)
    ranks = json.loads(out.read_text())["ranks"]
    assert [f for r in ranks for f in r["failures"]] == []
    r0 = ranks[0]
    # settled, then a recheck found the kept schedule 20 ms slower, and a trial replaced it
    assert r0["first"] is not None and r0["kept"] != r0["first"], r0
    assert r0["recheck_s"] >= 0.02 and r0["trial_s"][r0["kept"]] < 0.02
    assert "recheck" in r0["phases"] and r0["phases"][-1] == "settled"
    # choices() shows the new kept schedule, learned unless it is the model's own choice
    assert r0["choice"] == [r0["kept"], r0["kept"] != r0["choice"][2], r0["choice"][2]]
    # the memo ran the settled calls (and was dropped for the recheck); never under debug
    assert (r0["memo_seen"] > 0) == (mode == "memo")
    assert all({**r, "rank": 0, "memo_seen": 0} == {**r0, "memo_seen": 0} for r in ranks)


@pytest.mark.mpi
@pytest.mark.slow
def test_commrt_probe_saves_a_calibration_that_a_mismatched_job_refuses(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "out" / "calib.json"
    cmd = [sys.executable, "-m", "commrt", "probe", "--nproc", "2", "--backend", "mpi"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [*cmd, "--save", str(path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "probe (mpi, 2 ranks" in proc.stdout and "auto: " in proc.stdout
    # sizes in binary units, as everywhere commrt prints one
    assert re.search(r"step times: 8 B \d+ µs, 1 MiB \d+ µs", proc.stdout), proc.stdout
    # 80 columns, except where a path alone is wider (it is never broken)
    wide = [ln for ln in proc.stdout.splitlines() if len(ln) > 80 and str(tmp_path) not in ln]
    assert wide == [], proc.stdout
    saved = ProbeResult.load(path)
    assert saved.world_size == 2 and saved.repeats >= 5
    # the same file, said to come from 3 ranks: a job of 2 refuses it on every rank
    d = json.loads(path.read_text())
    path.write_text(json.dumps(d | {"world_size": 3}))
    bench = [sys.executable, "-m", "commrt", "bench", "allreduce", "--nproc", "2"]
    proc = subprocess.run(
        [*bench, "--backend", "mpi", "--algorithms", "auto", "--sizes", "4K"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(env, COMMRT_CALIBRATION=str(path)),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "saved calibration was taken on 3 ranks, 1 per node, over mpi; this job has 2" in out


def test_the_probe_times_the_reduction_out_of_the_caches():
    # an add of 4 MiB halves ran from the last-level cache, ten times faster than a large
    # bucket's reduction: the model priced recursive doubling level with the ring at 16 MiB
    # on 2 ranks, where it adds twice the bytes and ran 1.5× slower
    import types

    import torch

    from commrt.tuning import probe as probe_module

    added = []

    def reduce(dst, src):
        added.append((dst.numel() * 4, bool(src.eq(1).all())))

    comm = types.SimpleNamespace(
        device=torch.device("cpu"), executor=types.SimpleNamespace(reduce=reduce)
    )
    probe_module._time_reduce(comm, 4 << 20, repeats=1)
    assert added and all(n >= probe_module.GAMMA_BYTES == 32 << 20 for n, _ in added)
    assert all(touched for _, touched in added)  # real pages, not calloc's shared zero page
