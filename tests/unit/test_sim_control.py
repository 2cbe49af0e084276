"""The control-plane cost model (commrt.sim.control) and its section of `commrt simulate`."""

from __future__ import annotations

import argparse
import collections
import doctest
import math
import threading
from types import SimpleNamespace

import pytest

from commrt.cli import simulate_control
from commrt.sim import control
from commrt.sim.control import StoreCost, control_cost, first_saturated
from commrt.transports.base import Traits

COST = StoreCost(rtt_s=70e-6, op_s=70e-6, key_s=5e-6)
PS = [1 << k for k in range(2, 13)]


def test_counts_follow_the_protocol():
    c = control_cost(16, 1, COST, polls=2)
    arrival = 16 * 7  # dead check, ticket, name, 2 polls, read, look
    # 15 participants: setup-group check, ok count, 2 polls, look, check + get, look after
    # the update; the late rank: 2 polls, look, check + get; one compare_set
    commit = 15 * 8 + 1 * 5 + 1
    assert c.n == 15 and c.flat_ops == arrival + commit and c.flat_commit_ops == commit
    # 2 leaders (8 ranks per node), one extra record for the late rank: 6 operations each;
    # each leader commits for its node as a flat participant does (8), one compare_set
    assert c.two_level_ops == (2 + 1) * 6 + 2 * 8 + 1 and c.two_level_commit_ops == 17
    # server work: every rank reads N names in each poll and the read; the commit's keys
    # are one each; the two bursts queue apart (the reduction is between them)
    arrive_work = arrival * COST.op_s + 16 * 3 * 15 * COST.key_s
    commit_work = commit * COST.op_s
    slow = 1 - c.heartbeat_share
    assert c.flat_commit_s == pytest.approx(commit_work / slow)
    assert c.flat_s == pytest.approx(arrive_work / slow + commit_work / slow)
    assert c.flat_busy == pytest.approx((arrive_work + commit_work) / 0.1 + c.heartbeat_share)


def test_the_commit_adds_its_counted_operations_for_any_polls():
    # p = 4, b = 1, 3 checks per wait: arrival 4 · (5 + 3); commit 3 · (6 + 3) + (3 + 3) + 1
    c = control_cost(4, 1, COST, polls=3)
    assert c.flat_ops == 4 * 8 + (3 * 9 + 6 + 1) and c.flat_commit_ops == 34
    assert c.two_level_ops == (1 + 1) * 7 + (1 * 9 + 1)  # one node: one leader
    # without the commit the store's work would be arrival's alone: the busy share has more
    arrival_work = 4 * 8 * COST.op_s + 4 * 4 * 3 * COST.key_s
    assert c.flat_busy - c.heartbeat_share == pytest.approx((arrival_work + 34 * COST.op_s) / 0.1)


def test_the_two_level_commit_grows_with_the_nodes_not_the_ranks():
    a = control_cost(1024, 1, COST)
    b = control_cost(1024, 1, COST, ranks_per_node=16)
    assert a.two_level_commit_ops == 128 * 8 + 1 and b.two_level_commit_ops == 64 * 8 + 1
    assert a.flat_commit_ops == 1023 * 8 + 5 + 1 == b.flat_commit_ops  # O(p) flat
    assert 1.9 < a.two_level_ops / b.two_level_ops < 2.1


def test_heartbeats_are_linear_now_and_were_quadratic():
    a, b = control_cost(1024, 1, COST), control_cost(2048, 1, COST)
    assert b.heartbeat_share == pytest.approx(2 * a.heartbeat_share)
    assert b.heartbeat_share_before / a.heartbeat_share_before == pytest.approx(4, rel=1e-3)
    assert a.heartbeat_share == pytest.approx(3 * 1024 / 0.25 * COST.op_s)
    assert a.two_level_heartbeat_share == pytest.approx(a.heartbeat_share / 8)


def test_the_flat_store_is_quadratic_and_the_two_level_form_linear():
    costs = [control_cost(p, 1, COST, step_s=1.0) for p in (2048, 4096)]
    # the store's work per step: its busy share at one step a second, less the heartbeats'
    # (the O(p) commit adds a linear term, small by then)
    flat = [c.flat_busy - c.heartbeat_share for c in costs]
    two = [c.two_level_busy - c.two_level_heartbeat_share for c in costs]
    flat, two = flat[1] / flat[0], two[1] / two[0]
    assert 3.9 < flat < 4.1 and 1.9 < two < 2.1, (flat, two)


def test_a_small_job_waits_for_its_own_round_trips():
    fast_server = StoreCost(rtt_s=100e-6, op_s=1e-7, key_s=0.0)
    c = control_cost(4, 1, fast_server)
    # the store is idle: 7 round trips to arrive, 8 to commit
    assert c.flat_s == pytest.approx((7 + 8) * 100e-6)
    assert c.flat_commit_s == pytest.approx(8 * 100e-6)
    # and two local hops (to the leader and back) in each burst
    assert c.two_level_s == pytest.approx(2 * 2 * 100e-6 + (7 + 8) * 100e-6)


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
    for polls in (0, 1.5, True):
        with pytest.raises(ValueError, match="polls"):
            control_cost(8, 1, COST, polls=polls)
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
    text = "\n".join(lines)
    assert "arrival (who takes part) and\n# commit" in text  # the legend says what is priced
    c4 = control_cost(4, 1, COST)
    share = c4.flat_commit_ops * COST.op_s / 0.1 / (c4.flat_busy - c4.heartbeat_share)
    assert f"flat {share * 100:.2g}% at p = 4" in text
    assert "saturated" in body[-1]
    rows = rep["rows"]
    assert [r["p"] for r in rows] == PS and rows[-1]["flat_s"] is None  # inf → null in JSON
    assert rep["saturated_at"]["flat"] == first_saturated(
        [control_cost(p, 1, COST) for p in PS], "flat"
    )


def test_the_section_runs_alone(capsys):
    from commrt.cli import main

    argv = ["simulate", "--only", "control", "--max-p", "64", "--store-cost", "70,70,5"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [int(ln.split()[0]) for ln in lines if ln and ln.split()[0].isdigit()] == [
        4,
        8,
        16,
        32,
        64,
    ]
    assert all(len(ln) <= 80 for ln in lines) and "rtt 70 µs, 70 µs/op" in "\n".join(lines)


def test_the_model_beats_as_often_as_the_runtime():
    from commrt.sim import control
    from commrt.sync.backup.liveness import HEARTBEAT_S

    assert control.HEARTBEAT_S == HEARTBEAT_S  # the simulator keeps its own copy (no import)


def test_the_docstring_example_holds():
    result = doctest.testmod(control)
    assert result.failed == 0 and result.attempted > 0


class _Counting:
    """A store client counting its calls by (operation, first part of the key)."""

    def __init__(self, inner, tally: collections.Counter, lock: threading.Lock):
        self.inner, self.tally, self.lock = inner, tally, lock

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def counted(*args):
            key = args[0][0] if name in ("check", "multi_get") else args[0]
            with self.lock:
                self.tally[name, key.split("/")[0]] += 1
            return fn(*args)

        return counted


class _NoGroup:
    """The group made at setup, for a commit with nothing to reduce."""

    failed = False

    def schedules(self, inner, participants):
        return []


def test_the_commit_counts_match_the_runtime():
    """The runtime's own commit (recovery.Reduction, as on gloo) on a real store, 4 ranks as
    threads, 3 of them participants: every operation it makes is one the model counts. The
    polls (and the look for requests a missed poll makes) depend on timing: counted apart,
    the rest must be the model's commit at ``polls`` checks, less p·(polls + 1)."""
    from commrt.runtime.store import ControlStore, Host, host_store
    from commrt.sync.backup.recovery import Reduction

    p, n, steps = 4, 3, 5
    server = host_store()
    cs = ControlStore("127.0.0.1", server.port, Host.LAUNCHER, 30.0)
    tally, lock = collections.Counter(), threading.Lock()
    gloo = SimpleNamespace(
        name="gloo", traits=Traits(survives_peer_death=True)
    )  # a reduction is redone
    ctx = SimpleNamespace(comm=SimpleNamespace(transport=gloo))
    nobody_dead = SimpleNamespace(missing=frozenset(), recorded_dead=lambda name: False)

    def rank(r: int) -> None:
        store = _Counting(cs.client("commit"), tally, lock)
        me = SimpleNamespace(store=store, rank=r, p=p, n=n)
        red = Reduction(ctx, cs, "commit", me, nobody_dead, [], 30.0)
        red.setup_wire = _NoGroup()

        def look():  # the policy's idle work: catch-up requests
            store.add("wait-look", 0)

        for g in range(steps):
            red.begin(g, (0, 1, 2), r < n, ("0", "1", "2"))
            if red.commit(r < n, look, lambda taking_part: None):
                store.add("update-look", 0)  # BackupPolicy.apply serves after the update

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    per_step = {k: v / steps for k, v in tally.items()}
    polls = per_step.pop(("check", "o")) - p  # each rank checks once more after its poll
    looks = per_step.pop(("add", "wait-look"), 0)
    assert polls >= p and looks <= polls  # a rank polls once at least, looks after a miss
    assert per_step == {
        ("check", "broken"): n,  # participants, at round 0
        ("add", "ok"): n,
        ("compare_set", "o"): 1,
        ("get", "o"): p,
        ("add", "update-look"): n,
    }
    fixed = sum(per_step.values()) + p  # and the re-checks
    for k in (1, 2, 3):  # the model: k polls and one look per rank, and the same rest
        assert control_cost(p, p - n, COST, polls=k).flat_commit_ops == fixed + p * (k + 1)
