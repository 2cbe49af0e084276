"""What ``auto``'s learning costs, as each rank measures it and every rank agrees on it
(:mod:`commrt.algorithms.auto_cost`): clock readings are given, no wall clock."""

import math

import pytest

from commrt.algorithms.auto_cost import (
    GATHER_ALPHAS,
    GATHER_S,
    LEARN_CALL_ALPHAS,
    LEARN_CALL_S,
    LearningCost,
)

US = 1e-6


def measured(settled_us: float, settled_calls: int, phase_us: float, calls: int) -> list:
    """One rank's columns: ``settled_calls`` settled calls in ``settled_us``, then a phase of
    ``calls`` calls in ``phase_us`` (the gather before it took 200 µs)."""
    cost = LearningCost()
    cost.gathered(200 * US)
    cost.settled(0.0, settled_calls)
    cost.started(settled_us * US)
    return cost.columns((settled_us + phase_us) * US, calls)


def test_a_phase_costs_its_time_less_as_many_settled_calls():
    # 200 settled calls of 50 µs (the caller's work between them included), then 6 learning
    # calls in 900 µs: 600 µs beyond as many settled calls, 100 µs a call
    cost = LearningCost()
    row = measured(200 * 50, 200, 900, 6)
    assert row == [pytest.approx(600 * US), pytest.approx(200 * US), pytest.approx(50 * US)]
    assert cost.read([row, row], 6) == pytest.approx(600 * US + 200 * US)
    assert cost.call_s == pytest.approx(100 * US) and cost.gather_s == pytest.approx(200 * US)
    assert cost.settled_s == pytest.approx(50 * US)  # a settled call's period


def test_a_settled_period_is_the_ranks_median_and_kept_where_a_phase_cannot_tell():
    cost = LearningCost()
    rows = [measured(200 * t, 200, 900, 6) for t in (50, 60, 400)]  # one rank descheduled
    cost.read(rows, 6)
    assert cost.settled_s == pytest.approx(60 * US)
    cost.started(1.0)  # a trial pass: no settled calls just before it
    row = cost.columns(2.0, 6)
    assert math.isnan(row[2])
    cost.read([row, row, row], 6)
    assert cost.settled_s == pytest.approx(60 * US)


def test_every_rank_agrees_and_one_descheduled_rank_moves_nothing():
    quick, slow = measured(10_000, 200, 900, 6), measured(10_000, 200, 30_000, 6)
    costs = [LearningCost() for _ in range(3)]
    for cost in costs:  # each rank reads the same table
        cost.read([quick, slow, quick], 6)
    assert [c.call_s for c in costs] == [pytest.approx(100 * US)] * 3


def test_without_settled_calls_before_it_a_phase_is_charged_as_estimated():
    cost = LearningCost()
    cost.started(1.0)  # a trial pass right after the baseline: nothing to compare with
    row = cost.columns(2.0, 6)
    assert math.isnan(row[0]) and math.isnan(row[1]) and math.isnan(row[2])
    assert cost.read([row, row], 6) == pytest.approx(6 * LEARN_CALL_S + GATHER_S)
    assert (cost.call_s, cost.gather_s) == (LEARN_CALL_S, GATHER_S)
    # one rank that could not measure: the phase is charged as estimated as well
    assert cost.read([measured(10_000, 200, 900, 6), row], 6) == pytest.approx(
        6 * LEARN_CALL_S + GATHER_S
    )


def test_a_phase_quicker_than_settled_calls_costs_nothing_beyond_them():
    cost = LearningCost()
    row = measured(200 * 50, 200, 250, 6)  # the machine sped up meanwhile
    assert cost.read([row, row], 6) == pytest.approx(200 * US)  # its gather alone
    assert cost.call_s == 0.0


def test_the_estimate_is_the_median_of_the_latest_measurements():
    cost = LearningCost()
    for phase_us in (700, 700, 5000, 700):  # one phase met a busy spell
        row = measured(10_000, 200, phase_us, 6)
        cost.read([row, row], 6)
    assert cost.call_s == pytest.approx((700 - 300) / 6 * US)


def test_a_new_size_starts_from_what_other_sizes_measured():
    fresh = LearningCost.like([LearningCost(), LearningCost()])
    assert (fresh.call_s, fresh.gather_s) == (LEARN_CALL_S, GATHER_S)
    seen = LearningCost()
    row = measured(10_000, 200, 900, 6)
    seen.read([row, row], 6)
    started = LearningCost.like([LearningCost(), seen])
    assert started.call_s == pytest.approx(seen.call_s)
    assert started.gather_s == pytest.approx(200 * US)
    assert started.calls_s == []  # an estimate to start from, not a measurement of its own


def test_before_any_measurement_the_estimates_follow_the_probes_alpha():
    # learning's costs are latency-bound: a slow transport's first phases are priced as such
    alpha = 40 * US  # shm on 2 cores, p = 4
    slow = LearningCost.like([LearningCost()], alpha)
    assert slow.call_s == pytest.approx(LEARN_CALL_ALPHAS * alpha) and slow.call_s > LEARN_CALL_S
    assert slow.gather_s == pytest.approx(GATHER_ALPHAS * alpha) and slow.gather_s > GATHER_S
    # a quick one keeps the settings (the learning path's own work costs that at least)
    quick = LearningCost.like([], 1 * US)
    assert (quick.call_s, quick.gather_s) == (LEARN_CALL_S, GATHER_S)
    # what a size measured comes before any estimate
    seen = LearningCost()
    row = measured(10_000, 200, 900, 6)
    seen.read([row, row], 6)
    started = LearningCost.like([seen], alpha)
    assert (started.call_s, started.gather_s) == (seen.call_s, seen.gather_s)
