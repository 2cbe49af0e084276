"""The control-plane cost model (commrt.sim.control) and its section of `commrt simulate`."""

from __future__ import annotations

import argparse
import math

import pytest

from commrt.cli import simulate_control
from commrt.sim.control import StoreCost, control_cost, first_saturated

COST = StoreCost(rtt_s=70e-6, op_s=70e-6, key_s=5e-6)
PS = [1 << k for k in range(2, 13)]


def test_counts_follow_the_protocol():
    c = control_cost(16, 1, COST, polls=2)
    assert c.n == 15 and c.flat_ops == 16 * 7  # dead check, ticket, name, 2 polls, read, look
    # 2 leaders (8 ranks per node), one extra record for the late rank: 6 operations each
    assert c.two_level_ops == (2 + 1) * 6
    # server work: every rank reads N names in each poll and the read
    work = 16 * 7 * COST.op_s + 16 * 3 * 15 * COST.key_s
    assert c.flat_s == pytest.approx(work / (1 - c.heartbeat_share))
    assert c.flat_busy == pytest.approx(work / 0.1 + c.heartbeat_share)


def test_heartbeats_are_linear_now_and_were_quadratic():
    a, b = control_cost(1024, 1, COST), control_cost(2048, 1, COST)
    assert b.heartbeat_share == pytest.approx(2 * a.heartbeat_share)
    assert b.heartbeat_share_before / a.heartbeat_share_before == pytest.approx(4, rel=1e-3)
    assert a.heartbeat_share == pytest.approx(3 * 1024 / 0.25 * COST.op_s)
    assert a.two_level_heartbeat_share == pytest.approx(a.heartbeat_share / 8)


def test_the_flat_store_is_quadratic_and_the_two_level_form_linear():
    costs = [control_cost(p, 1, COST, step_s=1.0) for p in (1024, 2048)]
    # the store's work per step: its busy share at one step a second, less the heartbeats'
    flat = [c.flat_busy - c.heartbeat_share for c in costs]
    two = [c.two_level_busy - c.two_level_heartbeat_share for c in costs]
    flat, two = flat[1] / flat[0], two[1] / two[0]
    assert 3.9 < flat < 4.1 and 1.9 < two < 2.1, (flat, two)


def test_a_small_job_waits_for_its_own_round_trips():
    fast_server = StoreCost(rtt_s=100e-6, op_s=1e-7, key_s=0.0)
    c = control_cost(4, 1, fast_server)
    assert c.flat_s == pytest.approx(7 * 100e-6)  # the store is idle: 7 round trips
    assert c.two_level_s == pytest.approx(2 * 100e-6 + 7 * 100e-6)


def test_saturation_is_infinite_and_found():
    costs = [control_cost(p, 1, COST) for p in PS]
    flat, two = first_saturated(costs, "flat"), first_saturated(costs, "two-level")
    assert flat is not None and two is not None and flat < 1024 and two > flat
    big = control_cost(1 << 16, 1, COST)
    assert big.heartbeat_share > 1 and math.isinf(big.flat_s) and math.isinf(big.two_level_s)
    assert first_saturated([control_cost(4, 1, StoreCost(1e-6, 1e-9, 0.0))]) is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="p > b"):
        control_cost(2, 2, COST)
    with pytest.raises(ValueError, match="rtt_s must be positive"):
        StoreCost(0.0, 1e-6, 0.0)
    with pytest.raises(ValueError, match="RTT_US,OP_US,KEY_US"):
        StoreCost.parse("1,2")
    assert StoreCost.parse("69,72.4,5").op_s == pytest.approx(72.4e-6)
    with pytest.raises(argparse.ArgumentTypeError):
        simulate_control.store_cost("fast")


def test_the_section_fits_80_columns_and_returns_every_number():
    printed: list[str] = []
    rep = simulate_control.control_section([2, *PS], COST, 8, 0.1, printed.append)
    lines = "\n".join(printed).splitlines()
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    body = [ln for ln in lines if ln and ln.split()[0].isdigit()]
    assert [int(ln.split()[0]) for ln in body] == PS  # p = 4 … 4096, one line each
    assert "saturated" in body[-1]
    rows = rep["rows"]
    assert [r["p"] for r in rows] == PS and rows[-1]["flat_s"] is None  # inf → null in JSON
    assert rep["saturated_at"]["flat"] == first_saturated(
        [control_cost(p, 1, COST) for p in PS], "flat"
    )


def test_the_section_runs_alone(capsys):
    assert simulate_control.main(["--max-p", "64", "--store-cost", "70,70,5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [int(ln.split()[0]) for ln in lines if ln and ln.split()[0].isdigit()] == [
        4,
        8,
        16,
        32,
        64,
    ]
    assert all(len(ln) <= 80 for ln in lines) and "rtt 70 us, 70 us/op" in "\n".join(lines)


def test_the_model_beats_as_often_as_the_runtime():
    from commrt.sim import control
    from commrt.sync.backup.liveness import HEARTBEAT_S

    assert control.HEARTBEAT_S == HEARTBEAT_S  # the simulator keeps its own copy (no import)
