"""A replacement process rejoins a running backup-workers job under a dead rank's number.

4 real gloo ranks run tests/workers/backup_rejoin_worker.py (b = 1): rank 1
SIGKILLs itself inside global step KILL_AT's all-reduce (the test hook), the
survivors redo that step and carry on as the N = 3 every step needs; the test
then starts a replacement with RANK=1 and COMMRT_REJOIN=1. It catches up from
a snapshot and takes part again, nobody restarting: its gradients count (the
update of a step it took part in is exactly the float64 average of that
step's participants' distinct integer gradients, its own included), every
rank (survivors and replacement) ends bit-identical in parameters and
optimizer state, and each applied exactly the global steps there were.
"""

import json
import os
import sys
import time

import pytest
import torch
from helpers.backup import RAW
from helpers.mp import TESTS, GlooJob

sys.path.insert(0, os.path.join(TESTS, "workers"))
import backup_rejoin_worker as W  # noqa: E402

N_RANKS, BACKUPS = 4, 1
N = N_RANKS - BACKUPS


def start_job(tmp_path) -> GlooJob:
    job = GlooJob(
        "backup_rejoin_worker.py",
        (tmp_path, BACKUPS),
        N_RANKS,
        env={"COMMRT_TEST_KILL": f"1:{W.KILL_AT}"},
    )
    for r in range(N_RANKS):
        job.start(r)
    return job


def wait_exit(proc, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.poll()


def replacement(job: GlooJob, **env):
    """Start a replacement of rank 1 (the kill hook not inherited)."""
    return job.start(1, COMMRT_REJOIN="1", COMMRT_TEST_KILL=None, **env)


def records(tmp_path, names):
    recs = {k: json.loads((tmp_path / f"rejoin_{k}.json").read_text()) for k in names}
    states = {k: torch.load(tmp_path / f"rejoin_{k}.pt") for k in names}
    return recs, states


def replay(parts: dict[int, list[int]]) -> dict[str, torch.Tensor]:
    """The training again: step g's gradient is the float64 average of ``parts[g]``'s
    (exact in float32: the check says so), and the optimizer steps in float32 as the job's
    did (over a dozen steps SGD's momentum in float64 rounds differently from float32)."""
    model, done = W.model(), []
    opt = W.optimizer(model)
    for g in range(len(parts)):
        per_rank = [W.grads(model, r, g, N) for r in parts[g]]
        for i, p in enumerate(model.parameters()):
            avg = sum(t[i].double() for t in per_rank) / len(parts[g])
            done.append(torch.equal(avg.float().double(), avg))
            p.grad = avg.float()
        opt.step()
    assert all(done), "an average is not exact in float32: the check would be unsound"
    out = {f"param/{k}": v.detach() for k, v in model.named_parameters()}
    for i, p in enumerate(model.parameters()):
        out[f"state/{i}/momentum_buffer"] = opt.state[p]["momentum_buffer"]
    return out


def check_outputs(codes, outs, want):
    everything = "\n".join(
        f"--- process {i} exited {c}\n{o[-3000:]}" for i, (c, o) in enumerate(zip(codes, outs))
    )
    assert codes == want, everything
    for c, o in zip(codes, outs):
        if c == 0:
            assert not any(s in o for s in RAW), o


def participants(recs) -> dict[int, list[int]]:
    """Global step -> its participants, from every record of an on-time step (which all
    agree)."""
    parts = {}
    for rec in recs.values():
        for s in rec["steps"]:
            if s["role"] == "on time":
                g = s["computed_at"]
                assert parts.setdefault(g, s["participants"]) == s["participants"], (g, s)
    return parts


@pytest.mark.slow
def test_a_replacement_rejoins_catches_up_and_its_gradients_count(tmp_path):
    job = start_job(tmp_path)
    assert wait_exit(job.procs[1], 90) == -9, "rank 1 was not killed by the test hook"
    replacement(job)
    codes, outs = job.finish(150)
    check_outputs(codes, outs, [0, -9, 0, 0, 0])
    names = ["rank0", "rank1_1", "rank2", "rank3"]
    recs, states = records(tmp_path, names)
    for k, rec in recs.items():
        assert "error" not in rec, (k, rec)
        # updates applied == global steps held == where training ended (the replacement's
        # count includes the global steps its first snapshot brought)
        assert rec["global_step"] == rec["final"] == rec["updates"], (k, rec)
        assert rec["missing"] == [], (k, rec)  # everyone, rank 1 again, reached the end
    assert recs["rank1_1"]["incarnation"] == 1
    assert recs["rank1_1"]["steps"][0]["role"] == "joining", recs["rank1_1"]["steps"][0]
    # every rank bit-identical, parameters and momentum
    keys = sorted(states["rank0"])
    assert any(k.startswith("state/") for k in keys)
    for k in names[1:]:
        assert [x for x in keys if not torch.equal(states[k][x], states["rank0"][x])] == [], k
    parts = participants(recs)
    final = recs["rank0"]["final"]
    assert sorted(parts) == list(range(final)), parts
    back = [g for g, v in parts.items() if g > W.KILL_AT and 1 in v]
    assert len(back) >= 1, parts  # the replacement took part after the kill
    assert all(len(v) == N for v in parts.values()), parts
    # each update is exactly the average of that step's participants' gradients: the
    # replacement's (rank 1's formula) included where it took part
    want = replay(parts)
    assert sorted(want) == keys
    assert all(torch.equal(want[k], states["rank0"][k]) for k in keys), "not the exact average"
    # the check can fail: rank 3's gradient in place of the replacement's gives another model
    without = {g: ([r for r in v if r != 1] + [3] if g in back else v) for g, v in parts.items()}
    got = replay(without)
    assert not all(torch.equal(got[k], states["rank0"][k]) for k in keys)


@pytest.mark.slow
def test_a_replacement_that_dies_while_joining_is_survived_and_another_one_joins(tmp_path):
    """The first replacement SIGKILLs itself right after it came back (before its
    snapshot): the survivors record incarnation 1 dead and go on; a second replacement
    (incarnation 2) joins and everyone ends identical."""
    job = start_job(tmp_path)
    assert wait_exit(job.procs[1], 90) == -9
    first = replacement(job, COMMRT_TEST_KILL_JOIN="1")
    assert wait_exit(first, 60) == -9
    replacement(job)
    codes, outs = job.finish(180)
    check_outputs(codes, outs, [0, -9, 0, 0, -9, 0])
    names = ["rank0", "rank1_2", "rank2", "rank3"]
    recs, states = records(tmp_path, names)
    for rec in recs.values():
        assert "error" not in rec and rec["global_step"] == rec["final"] == rec["updates"], rec
    keys = sorted(states["rank0"])
    for k in names[1:]:
        assert [x for x in keys if not torch.equal(states[k][x], states["rank0"][x])] == [], k
    parts = participants(recs)
    assert any(g > W.KILL_AT and 1 in v for g, v in parts.items()), parts
    want = replay(parts)
    assert all(torch.equal(want[k], states["rank0"][k]) for k in keys), "not the exact average"
