"""Per-step overheads (commrt.sim.Overhead): how the replay prices them, and how the probe
fits them from timed all-reduces (commrt.tuning.probe_steps)."""

import dataclasses
import json

import numpy as np
import pytest

from commrt import sim
from commrt.algorithms import HalvingDoubling, PipelinedTorus2D, RecursiveDoubling, Ring
from commrt.schedule import SEND
from commrt.sim import Network, Overhead
from commrt.tuning.probe import ProbeResult
from commrt.tuning.probe_steps import CALIBRATION_BYTES, calibration_schedules, fit_overheads

OVER = Overhead(shift_s=1e-3, exchange_s=1.7e-3, multi_s=2.9e-3)
# 1 GB/s: 4 KiB crosses in 4 µs, far below any overhead
FAST = Network.flat(2e-3, 1e-9)


def _costs(pairs, p, over=OVER):
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*pairs))
    return over.rank_costs(src, dst, p)


def test_each_rank_pays_for_the_kind_of_step_it_takes_part_in():
    ring = [(r, (r + 1) % 4) for r in range(4)]
    assert _costs(ring, 4).tolist() == [1e-3] * 4
    pairs = [(0, 1), (1, 0), (2, 3), (3, 2)]
    assert _costs(pairs, 4).tolist() == [1.7e-3] * 4
    # rank 0 sends to 1 and 2 (and hears from both): several messages; rank 3 sits out
    many = [(0, 1), (1, 0), (0, 2), (2, 0)]
    assert _costs(many, 4).tolist() == [2.9e-3, 1.7e-3, 1.7e-3, 0.0]
    # a fold: 2 hands its data to 0 and hears nothing back that step
    assert _costs([(2, 0)], 3).tolist() == [1e-3, 0.0, 1e-3]


def test_a_message_takes_the_wire_or_the_overhead_whichever_is_longer():
    net = dataclasses.replace(FAST, overhead=OVER)
    # small: every step costs its overhead, α plays no part
    assert sim.simulate(Ring(), 4, CALIBRATION_BYTES, net).time_s == pytest.approx(6 * 1e-3)
    assert sim.simulate(RecursiveDoubling(), 4, 4096, net).time_s == pytest.approx(2 * 1.7e-3)
    # large: the wire alone (the overhead hides under it), not α + wire
    n = 64 << 20
    wire = 6 * (n / 4) * 1e-9
    assert sim.simulate(Ring(), 4, n, net).time_s == pytest.approx(wire, rel=1e-6)
    assert sim.simulate(Ring(), 4, n, FAST).time_s == pytest.approx(wire + 6 * 2e-3, rel=1e-6)


def test_a_pipelined_torus_pays_for_its_steps_of_several_messages():
    net = dataclasses.replace(FAST, overhead=OVER)
    sched = PipelinedTorus2D(2, 2, 4, False).select(4, 4096)
    busy = [np.bincount(s.rank[s.kind == SEND], minlength=4).max() for s in sched.steps]
    want = sum(2.9e-3 if b > 1 else 1.7e-3 for b in busy)  # a 2x2 grid: all exchanges
    assert sim.simulate(sched, None, 4096, net).time_s == pytest.approx(want)


def test_with_overheads_pricing_replays_instead_of_the_closed_forms():
    net = dataclasses.replace(FAST, overhead=OVER)
    for alg in (Ring(), HalvingDoubling(), RecursiveDoubling()):
        assert sim.estimate(alg, 8, 1 << 20, net) == sim.simulate(alg, 8, 1 << 20, net).time_s
    two = Network.from_probe(1e-3, 1e-9, (1e-3, 8e-9), ranks_per_node=2, overhead=OVER)
    times = sim.price_all([Ring(), HalvingDoubling(), RecursiveDoubling()], 8, 4096, two)
    assert None not in times  # no α-β lower bound skips a candidate


def test_overheads_are_checked_and_travel_with_the_network():
    with pytest.raises(ValueError, match="multi_s must be non-negative"):
        Overhead(1e-3, 1e-3, -1.0)
    with pytest.raises(TypeError, match="Network.overhead must be an Overhead"):
        Network(FAST.intra, FAST.inter, overhead=(1e-3, 1e-3, 1e-3))
    net = Network.from_probe(1e-3, 1e-9, (1e-3, 8e-9), ranks_per_node=2, overhead=OVER)
    assert Network.from_dict(json.loads(json.dumps(net.to_dict()))) == net
    assert "several messages 2.9 ms" in net.describe()


def _probe(**over) -> ProbeResult:
    return ProbeResult(
        1e-3, 1e-9, (8, 1 << 20), (1e-3, 2e-3), ((1e-3, 1e-9),), "gloo", 4, 1.0, **over
    )


def test_a_probe_result_carries_its_overheads_to_its_network_and_its_file(tmp_path):
    r = _probe(shift_s=1e-3, exchange_s=1.7e-3, multi_s=2.9e-3)
    assert r.network().overhead == OVER and "exchange 1.7 ms" in str(r)
    assert ProbeResult.load(r.save(tmp_path / "cal.json")) == r
    assert Network.load(tmp_path / "cal.json").overhead == OVER
    # a calibration saved before overheads were measured (or on a GPU) prices as it did
    old = _probe()
    path = old.save(tmp_path / "old.json")
    assert ProbeResult.load(path).network().overhead is None
    assert Network.load(path) == old.network() == Network.from_probe(1e-3, 1e-9)


@pytest.mark.parametrize(
    "p, kinds",
    [
        (2, {"exchange"}),
        (3, {"shift"}),
        (4, {"exchange", "shift", "multi"}),
        (6, {"shift", "multi"}),
    ],
)
def test_the_fit_finds_the_overheads_the_timed_schedules_took(p, kinds):
    scheds = calibration_schedules(p)
    assert set(scheds) == kinds
    net = Network.from_probe(2e-3, 1e-9, (2e-3, 8e-9), ranks_per_node=2) if p > 2 else FAST
    true = dataclasses.replace(net, overhead=OVER)
    times = {k: sim.simulate(s, None, CALIBRATION_BYTES, true).time_s for k, s in scheds.items()}
    got = fit_overheads(times, scheds, net)
    # what p ranks cannot show takes its neighbour's value (probe_steps' module doc)
    want = {
        2: Overhead(1.7e-3, 1.7e-3, 1.7e-3),
        3: Overhead(1e-3, 1e-3, 1e-3),
        4: OVER,
        6: Overhead(1e-3, 1e-3, 2.9e-3),
    }[p]
    for f in ("shift_s", "exchange_s", "multi_s"):
        assert getattr(got, f) == pytest.approx(getattr(want, f), rel=1e-6), f


def test_a_call_the_wire_alone_explains_gets_no_overhead():
    scheds = calibration_schedules(4)
    slow = Network.flat(0.0, 1e-6)  # 1 MB/s: the 32 KiB calls are all wire
    times = {
        k: 0.5 * sim.simulate(s, None, CALIBRATION_BYTES, slow).time_s for k, s in scheds.items()
    }
    assert fit_overheads(times, scheds, slow) == Overhead(0.0, 0.0, 0.0)
