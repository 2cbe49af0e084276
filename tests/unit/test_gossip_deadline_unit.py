"""Gossip's deadline options, the live set in its schedule, and the deadline's clock."""

import pytest

from commrt.algorithms import Gossip
from commrt.schedule import tags
from commrt.sync.families import FAMILIES
from commrt.sync.gossip_deadline import DeadlineGossipPolicy
from commrt.sync.gossip_ledger import AUTO_FACTOR, AUTO_MIN_S, AUTO_WARMUP, DeadlineClock


def test_deadline_off_by_default_keeps_the_plain_policy():
    assert Gossip().deadline_s is None and Gossip().family == "gossip"
    g = Gossip(deadline_s=0.1)
    assert g.family == "gossip-deadline" and FAMILIES[g.family] is DeadlineGossipPolicy
    assert "deadline=auto" in str(Gossip(deadline_s="auto"))


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "soon", True, [1]])
def test_a_bad_deadline_is_refused_at_construction(bad):
    with pytest.raises(ValueError, match="deadline_s"):
        Gossip(deadline_s=bad)


@pytest.mark.parametrize("topology", ["hypercube", "dissemination"])
def test_the_dead_leave_every_survivors_schedule_and_survivor_pairs_stay(topology):
    g = Gossip(topology=topology, rotate=True, seed=3)
    p, dead = 8, 5
    live = set(range(p)) - {dead}
    for t in range(12):
        for r in live:
            full = g.peers(r, t, p)
            send, recv = g.peers(r, t, p, live=live)
            assert dead not in (send, recv)
            # a pair of survivors is the same pair as before the death (no agreement needed)
            assert send == (full[0] if full[0] != dead else r)
            assert recv == (full[1] if full[1] != dead else r)
    # every survivor that had the dead rank as partner in a period now has none that step
    assert any(g.peers(r, t, p, live=live) == (r, r) for r in live for t in range(3))


def test_gossip_tags_are_per_step_and_bucket_inside_their_range():
    lo, hi = tags.RANGES["gossip deadline"]
    seen = {tags.gossip(s, b) for s in (0, 1, tags.GOSSIP_STEPS - 1) for b in (0, 1023)}
    assert len(seen) == 6 and all(lo <= t < hi for t in seen)


def test_auto_deadline_waits_in_full_then_takes_a_multiple_of_the_median():
    clock = DeadlineClock("auto", timeout_s=60.0)
    for _ in range(AUTO_WARMUP - 1):
        clock.observe(0.01)
    assert clock.seconds() == 60.0
    for x in [0.01] * 20 + [5.0] * 10:  # a straggler partner a third of the time
        clock.observe(x)
    assert clock.seconds() == pytest.approx(AUTO_FACTOR * 0.01)
    fast = DeadlineClock("auto", timeout_s=60.0)
    for _ in range(AUTO_WARMUP):
        fast.observe(1e-6)
    assert fast.seconds() == AUTO_MIN_S
    assert DeadlineClock(0.25, timeout_s=60.0).seconds() == 0.25
