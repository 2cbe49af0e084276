"""Backup workers when a participant dies INSIDE a global step's all-reduce.

4 real gloo ranks run tests/workers/backup_redo_worker.py; the test hook
``COMMRT_TEST_KILL`` (tests/helpers/faults.py) SIGKILLs the named ranks
right after their first send of global step ``KILL_AT``'s reduction. The
checks: with at most b deaths the survivors agree on new participants
through the store and redo that step from the gradients they kept (the
update is exactly the float64 average of the final participants'
gradients, every survivor bit-identical, updates applied == global steps,
no raw gloo error); with more deaths than backups every live rank raises
CommTimeoutError naming the dead ranks within the timeout plus a few
seconds.
"""

import json
import os
import sys

import pytest
import torch
from helpers.mp import TESTS, gloo_ranks

sys.path.insert(0, os.path.join(TESTS, "workers"))
import backup_redo_worker as W  # noqa: E402
from helpers.backup import RAW

N_RANKS = 4
#: the hung test's timeout: long enough that a wait lasting it cannot pass for a redo
HUNG_TIMEOUT_S = 15.0


def run(tmp_path, scenario, backups, kill):
    env = {"COMMRT_TEST_KILL": f"{kill}:{W.KILL_AT}"}
    codes, outs = gloo_ranks(
        N_RANKS, "backup_redo_worker.py", scenario, tmp_path, backups, timeout=150, env=env
    )
    dead = {int(r) for r in kill.split(",")}
    live = [r for r in range(N_RANKS) if r not in dead]
    everything = "\n".join(
        f"--- rank {r} exited {c}\n{o[-3000:]}" for r, (c, o) in enumerate(zip(codes, outs))
    )
    assert [codes[r] for r in sorted(dead)] == [-9] * len(dead), everything
    assert [codes[r] for r in live] == [0] * len(live), everything
    recs = {r: json.loads((tmp_path / f"{scenario}_rank{r}.json").read_text()) for r in live}
    states = {r: torch.load(tmp_path / f"{scenario}_rank{r}.pt") for r in live}
    for r in live:  # no raw transport error anywhere: not printed, not raised
        assert not any(s in outs[r] for s in RAW), outs[r]
        assert not any(s in recs[r].get("error", "") for s in RAW), recs[r]
    return live, recs, states


def replay(parts: dict[int, list[int]], n: int) -> dict[str, torch.Tensor]:
    """The training in float64: step g's update is the average of ``parts[g]``'s gradients."""
    model = W.model().double()
    opt = W.optimizer(model)
    for g in range(len(parts)):
        per_rank = [W.grads(model, r, g, n) for r in parts[g]]
        for i, p in enumerate(model.parameters()):
            p.grad = sum(t[i] for t in per_rank) / len(parts[g])
        opt.step()
    out = {f"param/{k}": v.detach() for k, v in model.named_parameters()}
    for i, p in enumerate(model.parameters()):
        out[f"state/{i}/momentum_buffer"] = opt.state[p]["momentum_buffer"]
    return out


@pytest.mark.parametrize("backups", [1, 2])
@pytest.mark.slow
def test_a_participant_killed_inside_the_all_reduce_is_redone_by_the_survivors(tmp_path, backups):
    """Ranks 0..N-1 take part (the others are slow), rank 1 dies inside step KILL_AT's
    all-reduce; the survivors redo that step with N participants again. b = 1: the late
    rank 3 must join (3 live = N); b = 2: the first two of the three live ranks to take a
    ticket of the new round do it, and the third catches up as a late rank."""
    live, recs, states = run(tmp_path, "redo", backups, "1")
    n = N_RANKS - backups
    parts = {}
    for r in live:
        rec = recs[r]
        assert "error" not in rec, rec
        # updates applied == global steps held == where training ended, on every survivor
        # (sync.step returns them; a rank whose loop ended first catches up in close())
        assert rec["global_step"] == rec["final"] == rec["updates"] >= sum(rec["applied"]), rec
        assert rec["missing"] == [1], rec
        for s in rec["steps"]:
            if s["role"] == "on time":
                g = s["computed_at"]
                assert parts.setdefault(g, s["participants"]) == s["participants"], (g, s)
                assert s["redone"] == (1 if g == W.KILL_AT else 0), s
        if backups == 1:  # one group made, for the redo; the later steps (same ranks) reuse it
            made = [s["groups_made"] for s in rec["steps"] if s["role"] == "on time"]
            assert made[-1] == 1, rec
    final = recs[0]["final"]
    assert sorted(parts) == list(range(final)), parts
    if backups == 1:  # the redo: the live ranks, the late rank 3 included
        assert parts[W.KILL_AT] == [0, 2, 3], parts
    assert len(parts[W.KILL_AT]) == n and 1 not in parts[W.KILL_AT], parts
    assert all(len(v) == n and 1 not in v for g, v in parts.items() if g >= W.KILL_AT), parts
    # every survivor bit-identical (parameters and momentum)
    keys = sorted(states[0])
    assert any(k.startswith("state/") for k in keys)
    for r in live[1:]:
        assert [k for k in keys if not torch.equal(states[r][k], states[0][k])] == [], r
    # each update is exactly the average of that step's final participants' gradients
    want = replay(parts, n)
    assert sorted(want) == keys
    assert all(torch.equal(want[k].float(), states[0][k]) for k in keys), "not the exact average"
    assert all(torch.equal(want[k].float().double(), want[k]) for k in keys)  # exact in float32
    # the check can fail: averaging the first try's participants (with dead rank 1) differs
    first_try = {**parts, W.KILL_AT: list(range(n))}
    got = replay(first_try, n)
    assert not all(torch.equal(got[k].float(), states[0][k]) for k in keys)


@pytest.mark.parametrize("backups,kill", [(0, "1"), (1, "1,2")])
@pytest.mark.slow
def test_more_deaths_than_backups_raise_a_timeout_naming_the_dead(tmp_path, backups, kill):
    """b = 0 with one death, b = 1 with two, inside the all-reduce: every live rank raises
    CommTimeoutError naming the dead ranks within the timeout plus a few seconds."""
    live, recs, _ = run(tmp_path, "toomany", backups, kill)
    dead = sorted(int(r) for r in kill.split(","))
    for r in live:
        rec = recs[r]
        assert rec.get("error_type") == "CommTimeoutError", rec
        assert f"missing ranks {dead}" in rec["error"], rec["error"]
        took = rec["error_at"] - rec["step_began"]
        assert took < W.TIMEOUT_S + 5.0, (took, rec)


def test_gloo_pairs_outlive_a_dead_member_and_abort_fails_a_blocked_peer_at_once(tmp_path):
    """The facts the redo rests on (tests/workers/gloo_death_worker.py): after one member's
    SIGKILL the others still exchange on the same group, and a receive from the dead one
    fails at once; aborting a group ends a peer's blocked receive at once, not at the
    timeout. (A group is still never reused after a failure: receives that never completed
    stay posted there, commrt/sync/backup/wire.py.)"""
    from gloo_death_worker import ABORT_AFTER_S, TIMEOUT_S

    codes, outs = gloo_ranks(3, "gloo_death_worker.py", tmp_path, timeout=60)
    assert codes == [0, 0, -9], "\n".join(outs)
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rec in recs:
        assert rec["pair_ok"] is True, rec
        assert rec["dead_recv_s"] is not None and rec["dead_recv_s"] < 2.0, rec
    took = recs[0]["aborted_s"]
    assert took is not None and ABORT_AFTER_S * 0.5 < took < TIMEOUT_S / 2, recs[0]


@pytest.mark.slow
def test_a_participant_hung_inside_the_all_reduce_is_redone_once_it_is_recorded_dead(tmp_path):
    """Rank 1 SIGSTOPs itself inside step KILL_AT's all-reduce (its connections stay open,
    so no gloo error comes). The rank waiting on it gives the wait up once rank 1 is
    recorded dead (dead_after_s), the others are failed by its aborted group, and the step
    is redone without rank 1 well before the timeout (15 s here; it used to take the whole
    timeout). Woken later, rank 1 finds it was declared dead and stops with that error."""
    env = {"COMMRT_TEST_KILL": f"1:{W.KILL_AT}:STOP", "REDO_TIMEOUT_S": str(HUNG_TIMEOUT_S)}
    codes, outs = gloo_ranks(
        N_RANKS, "backup_redo_worker.py", "redo", tmp_path, 1, timeout=150, env=env
    )
    assert codes == [0] * N_RANKS, "\n".join(outs)
    recs = {r: json.loads((tmp_path / f"redo_rank{r}.json").read_text()) for r in range(4)}
    states = {r: torch.load(tmp_path / f"redo_rank{r}.pt") for r in (0, 2, 3)}
    assert recs[1].get("error_type") == "RankDeclaredDeadError", recs[1]
    for r in (0, 2, 3):
        rec = recs[r]
        assert "error" not in rec and not any(s in outs[r] for s in RAW), (rec, outs[r])
        assert rec["global_step"] == rec["final"] == rec["updates"] >= sum(rec["applied"]), rec
        redo = [s for s in rec["steps"] if s["computed_at"] == W.KILL_AT]
        assert redo and redo[0]["participants"] == [0, 2, 3] and redo[0]["redone"] == 1, rec
        if r != 3:  # the participants
            took = redo[0]["at"] - rec["step_began"]
            assert took < W.DEAD_AFTER_S + 5.0 < HUNG_TIMEOUT_S, (took, rec)
    keys = sorted(states[0])
    for r in (2, 3):
        assert [k for k in keys if not torch.equal(states[r][k], states[0][k])] == [], r


def test_a_member_recorded_dead_ends_a_groups_rendezvous_instead_of_its_timeout():
    """A death while a redo round's group is made cost the whole timeout (gloo's rendezvous
    waits for every member's address; two chaos trials took 44-48 s). Two ranks make a
    group with a third that never comes; once it is "recorded dead" (here: 0.3 s in) both
    get the group's error naming that, not gloo's own timeout error, which the 120 s
    timeout would only give long after this test's own time limit."""
    import datetime
    import threading
    import time

    import torch.distributed as dist

    from commrt.sync.backup.wire import make_wire

    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30))

    class Store:  # what a ControlStore gives the policy: clients under a prefix
        def client(self, prefix):
            tcp = dist.TCPStore("127.0.0.1", server.port, None, False)
            return dist.PrefixStore(prefix, tcp)

    began = time.monotonic()
    errors = {}

    def member(rank):
        try:
            gone = lambda: time.monotonic() - began > 0.3  # noqa: E731  rank 2 recorded dead
            make_wire(Store(), "t", 5, 1, (0, 1, 2), rank, 120.0, gone=gone)
        except RuntimeError as e:
            errors[rank] = str(e)

    threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert sorted(errors) == [0, 1], errors
    assert all("recorded dead while the group was made" in e for e in errors.values()), errors
