"""Ranks that run different numbers of steps.

Either every rank wraps its loop in ``GradientSync.join`` (ranks out of data
shadow the others' steps, the average is over the ranks still training), or a
rank that closes or exits early is named to the ranks still waiting for it,
within seconds instead of the 300 s timeout, on MPI and on gloo, for plain
``commrt.all_reduce`` loops and for GradientSync loops.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch
from helpers.local_transport import run_ranks
from helpers.mp import gloo_ranks, mpiexec
from workers.uneven_worker import loss, model, reference, shard

import commrt
from commrt.algorithms import BackupWorkers, Gossip
from commrt.diagnosis.departures import CLOSED, EXITED, FAILED, Departures, Farewell
from commrt.errors import PeerFailedError
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.sync.backup import BackupPolicy
from commrt.sync.gossip import GossipPolicy
from commrt.transports.base import Traits

#: the worker's steps: rank r runs STEPS + r
STEPS = 4
#: far below the default 300 s timeout, far above the ~0.1 s it takes
NAMED_WITHIN_S = 10.0


def _reports(backend: str, n: int, mode: str, loop: str, tmp_path) -> list[dict]:
    """Run uneven_worker.py on ``n`` ranks; each rank's report, in rank order."""
    args = (backend, mode, loop, STEPS, tmp_path)
    t0 = time.monotonic()
    if backend == "mpi":
        proc = mpiexec(n, "uneven_worker.py", *args, timeout=240, check=False)
        codes, out = [proc.returncode], proc.stdout + proc.stderr
    else:
        codes, outs = gloo_ranks(n, "uneven_worker.py", *args, timeout=240)
        out = "".join(outs)
    # every process ended by itself (none was killed at the timeout), and well before the
    # 60 s communicator timeout the worker sets would have ended a hang
    assert codes == [0] * len(codes), (codes, out)
    assert time.monotonic() - t0 < 200, out
    files = sorted(tmp_path.glob("rank*.json"))
    assert len(files) == n, out
    return [json.loads(f.read_text()) for f in files]


# ------------------------------------------------------------------ join: ragged shards


def _check_join(params: list[torch.Tensor], world_size: int) -> None:
    """Every rank holds the same parameters, equal to the float64 reference of the mean
    over the ranks still training at each step (and not to a mean over all ranks)."""
    for p in params[1:]:
        assert torch.equal(p, params[0])
    ref = torch.tensor(_flat(reference(world_size, STEPS, 0.1)), dtype=torch.float64)
    wrong = torch.tensor(_flat(reference(world_size, STEPS, 0.1, over_all=True)))
    got = params[0].double()
    assert (got - ref).abs().max().item() < 1e-5, (got - ref).abs().max()
    # the test can tell: averaging over every rank would be this far off
    assert (got - wrong).abs().max().item() > 1e-3


def _flat(m) -> list[float]:
    return torch.cat([p.detach().flatten() for p in m.parameters()]).tolist()


def test_join_ragged_shards_on_threads():
    def body(tr):
        info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
        comm = Communicator(tr, Backend.GLOO, info, 10, 1 << 20)
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        sync = commrt.GradientSync(m, comm, bucket_mb=1e-4, first_bucket_mb=1e-4)
        assert len(sync.buckets) > 1
        mine = shard(comm.rank, STEPS)
        with sync.join(opt):
            for batch in mine:
                loss(m, batch).backward()
                sync.step(opt)
        sync.close()
        return torch.tensor(_flat(m)), len(mine)

    out = run_ranks(3, body)
    assert [n for _, n in out] == [STEPS, STEPS + 1, STEPS + 2]
    _check_join([p for p, _ in out], 3)


@pytest.mark.mpi
@pytest.mark.parametrize("backend,n", [pytest.param("mpi", 3, marks=pytest.mark.slow), ("gloo", 2)])
def test_join_ragged_shards_on_real_ranks(backend, n, tmp_path):
    reports = _reports(backend, n, "join", "gradsync", tmp_path)
    assert [r.get("error") for r in reports] == [None] * n, reports
    assert [r["steps"] for r in reports] == [STEPS + r for r in range(n)]
    _check_join([torch.tensor(r["params"]) for r in reports], n)


def test_join_is_refused_where_it_does_not_apply():
    with pytest.raises(ValueError, match=r"gossip: each step mixes .* ONE peer"):
        GossipPolicy(Gossip()).join()
    with pytest.raises(ValueError, match=r"backup.*tolerates missing ranks by design"):
        BackupPolicy(BackupWorkers(backups=1)).join()


def test_join_refuses_a_step_in_flight():
    def body(tr):
        info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
        comm = Communicator(tr, Backend.GLOO, info, 10, 1 << 20)
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        sync = commrt.GradientSync(m, comm)
        loss(m, shard(0, 1)[0]).backward()
        with pytest.raises(RuntimeError, match="step in flight"):
            sync.join(opt)
        sync.step(opt)
        sync.close()

    run_ranks(2, body)


# ------------------------------------------------------------------ a rank that leaves early


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
@pytest.mark.parametrize(
    "loop,mode",
    [
        ("allreduce", "close"),  # closes while the other waits in its next call
        ("allreduce", "exit"),  # returns from main: the interpreter exits, nothing closed
        ("allreduce", "idle"),  # closes while the other computes, then the other calls
        ("gradsync", "close"),
        ("gradsync", "exit"),
    ],
)
@pytest.mark.slow
def test_a_rank_that_leaves_early_is_named_to_the_ranks_waiting(backend, loop, mode, tmp_path):
    first, second = _reports(backend, 2, mode, loop, tmp_path)
    assert first == {"rank": 0, "steps": STEPS}, first
    assert second["error"] == "PeerClosedError", second
    unit = "collective call" if loop == "allreduce" else "GradientSync step"
    how = "exited" if mode == "exit" else "closed its communicator"
    first = 0 if loop == "gradsync" else 1  # GradientSync steps count from 0, as range()
    said = (
        f"rank 0 {how} after {unit} {STEPS - 1 + first} while rank 1 waits in "
        f"{unit} {STEPS + first}"
    )
    assert said in second["message"], second["message"]
    # the way out, for commrt's own loop and for DDP over the commrt backend
    assert "GradientSync.join(optimizer) (under DDP: `with ddp_model.join():`)" in second["message"]
    # from rank 0 leaving (or, idle, from rank 1's call after it) to rank 1's error
    assert second["waited_s"] < NAMED_WITHIN_S, second
    sys.stdout.write(f"{backend} {loop} {mode}: named after {second['waited_s']:.3f} s\n")


@pytest.mark.mpi
def test_an_uncaught_farewell_error_ends_the_whole_job(tmp_path):
    # the default: nobody catches it, so the waiting rank's error ends the job at once
    script = tmp_path / "job.py"
    script.write_text(
        "import torch, commrt\n"
        "comm = commrt.init()\n"
        "t = torch.ones(100)\n"
        "for _ in range(2 + comm.rank):\n"
        "    commrt.all_reduce(t, comm)\n"
        "comm.close()\n"
    )
    cmd = [shutil.which("mpiexec"), "-n", "2", sys.executable, str(script)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert time.monotonic() - t0 < 150, out  # the default timeout is 300 s
    assert re.search(r"rank 0 closed its communicator after collective call 2 while rank 1", out)
    assert "ending the whole job" in out, out


# ------------------------------------------------------------------ the rule, without processes


class _Alone:
    """A transport stand-in with neither testable receives nor a store."""

    rank, world_size, traits, store = 1, 3, Traits(), None


def test_a_farewell_ends_only_waits_the_peer_will_never_join():
    d = Departures(_Alone())
    for _ in range(5):
        d.begin_call()
    d.left[0] = Farewell(0, calls=5, sync_steps=0, how=CLOSED)
    # rank 0 finished call 5 itself: this rank's wait in call 5 may still complete
    assert d.blocking() is None
    d.begin_call()
    err = d.blocking()
    assert err is not None and (err.peer, err.peer_done, err.waiting_in) == (0, 5, 6)
    assert "rank 0 closed its communicator after collective call 5 while rank 1" in str(err)
    # GradientSync steps are counted apart from calls
    d.left[2] = Farewell(2, calls=99, sync_steps=3, how=EXITED)
    d.begin_sync()  # waits in GradientSync step 0 (named from 0, as a loop over range())
    assert "before GradientSync step 0 while" in str(d.blocking())  # rank 0 finished none
    del d.left[0]
    assert d.blocking() is None  # rank 2 finished steps 0 to 2
    for _ in range(3):
        d.end_sync()
        d.begin_sync()
    err = d.blocking()
    assert (err.peer, err.unit, err.peer_done, err.waiting_in) == (2, "GradientSync step", 2, 3)
    assert "rank 2 exited after GradientSync step 2 while rank 1 waits in GradientSync step 3" in (
        str(err)
    )


def test_a_farewell_of_a_failed_peer_names_where_the_failure_began():
    d = Departures(_Alone())
    for _ in range(5):
        d.begin_call()
    # rank 2 failed in call 5 (the one this rank waits in) because rank 0 died
    d.left[2] = Farewell(2, calls=5, sync_steps=0, how=FAILED, cause=0)
    err = d.blocking()
    assert isinstance(err, PeerFailedError) and (err.peer, err.cause) == (2, 0)
    assert "rank 2 ended after a failure that began at rank 0, while rank 1 waits" in str(err)
    assert "rank 0's output says why" in str(err)
    assert Farewell.from_row(2, d.left[2].row()) == d.left[2]  # what travels
    d.left[2] = Farewell(2, calls=5, sync_steps=0, how=FAILED)  # it knew no cause
    assert d.blocking().cause is None and "began at rank 2 itself" in str(d.blocking())
