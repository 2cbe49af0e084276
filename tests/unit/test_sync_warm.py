"""Gossip and backup workers warm the reduce kernel at construction, as the all-reduce family
does: on CUDA its first launch per size autotunes (a device synchronisation, a large flush
buffer, copies of the destination), which must not happen on the progress thread during
the first backward.

Ranks are threads over an in-process transport; the CUDA test and the executor's warm-up
are replaced by stand-ins that record which rank's pieces of which bucket would be
launched. tests/multiprocess/test_nccl_rules.py checks the warm-up itself (the piece sizes
of a plan, on scratch zeros) and the all-reduce family's use of it.
"""

from __future__ import annotations

import threading

import pytest
import torch
from helpers.gossip import gossip_model
from helpers.local_transport import LocalTransport, Mailbox

import commrt
from commrt.algorithms import BackupWorkers, Gossip
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.schedule.executor import Executor
from commrt.sync import buffers as B
from commrt.sync.backup import parts as BP


def each_rank(p, fn):
    """``fn(comm)`` on p thread ranks; each rank's result (an error is raised)."""
    box, out = Mailbox(), [None] * p

    def body(r):
        tr = LocalTransport(box, r, p)
        info = LaunchInfo("none", r, p, 0, None)
        try:
            out[r] = fn(Communicator(tr, Backend.GLOO, info, 20.0, 1 << 20))
        except BaseException as e:  # returned, so that every rank's error is seen
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


@pytest.fixture
def warmed(monkeypatch):
    """CUDA's answer to "does this autotune?" everywhere, and Executor.warm recording
    (executor, schedule rank, bucket elements) instead of launching."""
    monkeypatch.setattr(B, "needs_tuning", lambda device: True)
    monkeypatch.setattr(BP, "needs_tuning", lambda device: True)
    seen, lock = [], threading.Lock()

    def warm(self, schedule, rank, buf, piece_bytes):
        with lock:
            seen.append((id(self), rank, buf.numel()))
        return 1

    monkeypatch.setattr(Executor, "warm", warm)
    return seen


def _build(alg):
    def body(comm):
        sync = commrt.GradientSync(
            gossip_model(), comm, algorithm=alg, bucket_mb=0.02, first_bucket_mb=0.005
        )
        numels = [b.numel for b in sync.buckets]
        sync.close()
        return id(comm.executor), comm.rank, numels

    return body


@pytest.mark.parametrize(
    "p,alg",
    [(2, Gossip()), (4, Gossip(asynchronous=True)), (3, Gossip("dissemination", rotate=True))],
    ids=str,
)
def test_gossip_warms_every_bucket_at_construction(warmed, p, alg):
    for ex, rank, numels in each_rank(p, _build(alg)):
        assert len(numels) >= 3
        assert sorted(n for e, r, n in warmed if e == ex) == sorted(numels)
        assert {r for e, r, n in warmed if e == ex} == {rank}


def test_gossip_on_one_rank_moves_nothing_and_warms_nothing(warmed):
    each_rank(1, _build(Gossip()))
    assert warmed == []


@pytest.mark.parametrize("p,b", [(3, 1), (4, 2)])
def test_backup_workers_warm_every_place_among_the_participants(warmed, p, b):
    """This rank may be any of the N = p - b participants' places in a step."""
    for ex, _, numels in each_rank(p, _build(BackupWorkers(backups=b))):
        mine = sorted((r, n) for e, r, n in warmed if e == ex)
        assert mine == sorted((r, n) for n in numels for r in range(p - b))


def test_nothing_is_warmed_on_the_cpu(monkeypatch):
    launched = []
    monkeypatch.setattr(Executor, "warm", lambda *a: launched.append(a))
    each_rank(2, _build(Gossip()))
    each_rank(3, _build(BackupWorkers(backups=1)))
    assert launched == []
    assert not B.needs_tuning(torch.device("cpu"))
