"""Gossip's deadline options, the live set in its schedule, and the deadline's clock."""

import numpy as np
import pytest

from commrt import sim
from commrt.algorithms import Gossip
from commrt.algorithms.gossip import AUTO_FACTOR, AUTO_MIN_S, AUTO_WARMUP
from commrt.schedule import tags
from commrt.sync.families import FAMILIES
from commrt.sync.gossip.deadline import DeadlineGossipPolicy
from commrt.sync.gossip.ledger import DeadlineClock


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


class _OneSlowRank:
    """Rank 3 is late by ``late_s`` every step; the others never."""

    def __init__(self, late_s):
        self.late_s = late_s

    def sample(self, rng, size):
        d = np.zeros(size)
        d[3] = self.late_s
        return d


def test_simulated_deadline_keeps_the_others_at_their_pace_and_counts_staleness():
    kw = dict(compute_s=0.1, delay=_OneSlowRank(1.0), steps=60)
    plain = sim.simulate_gossip_deadline(Gossip(), 16, 1 << 20, deadline_s=None, **kw)
    late = sim.simulate_gossip_deadline(Gossip(), 16, 1 << 20, deadline_s=0.05, **kw)
    others = np.delete(np.arange(16), 3)
    # plain gossip: the slow rank sets everyone's pace (1.1 s a step) within log2 p steps
    assert plain.step_s[20:, others].mean(axis=0).min() > 1.0
    assert plain.stale_share(0) == 1.0
    # with a deadline the others wait at most 50 ms beyond their own step
    assert late.step_s[:, others].max() <= 0.1 + 0.05 + 0.01
    assert late.stale_share(1, at_least=True) > 0  # rank 3's messages land steps late
    auto = sim.simulate_gossip_deadline(Gossip(), 16, 1 << 20, **kw)
    assert auto.step_s[:, others].mean() < 0.2 and auto.deadline_s < 0.1


def test_the_ddp_gossip_hook_refuses_a_deadline_it_would_not_keep():
    from types import SimpleNamespace

    from commrt.distributed.hooks import GossipState

    with pytest.raises(ValueError, match="GradientSync for Gossip.deadline_s"):
        GossipState(SimpleNamespace(world_size=4, rank=0), Gossip(deadline_s=0.1))
