"""commrt.broadcast: the schedules (checked symbolically), and real processes
against MPI Bcast and torch.distributed.broadcast."""

import json

import pytest
from helpers.mp import mpiexec

from commrt.algorithms import BinomialTree, PipelinedChain
from commrt.algorithms.broadcast import TREE_MAX_BYTES, choose
from commrt.schedule import Collective, Op, OpKind, Schedule, Step

ALGORITHMS = [
    BinomialTree(),
    PipelinedChain(chunks=1),
    PipelinedChain(chunks=3),
    PipelinedChain(chunks=8),
]


@pytest.mark.parametrize("alg", ALGORITHMS, ids=repr)
def test_broadcast_schedules_are_correct_for_p_1_to_64_every_root(alg):
    for p in range(1, 65):
        for root in sorted({0, 1 % p, p // 2, p - 1}):
            s = alg.schedule(p, root=root)
            report = s.check()
            assert report.ok, str(report)
            assert s.collective is Collective.BROADCAST and set(s.owners) == {root}


def test_broadcast_step_counts_and_subsets():
    assert BinomialTree().schedule(64).num_steps == 6
    assert BinomialTree().schedule(65).num_steps == 7
    assert PipelinedChain(chunks=8).schedule(10).num_steps == 10 - 2 + 8
    sub = BinomialTree().schedule(10, ranks=(9, 2, 5, 7), root=5)
    assert sub.check().ok and sub.ranks == (9, 2, 5, 7)
    with pytest.raises(ValueError, match="root 3 is not among"):
        BinomialTree().schedule(10, ranks=(1, 2), root=3)
    with pytest.raises(ValueError, match="broadcast only"):
        BinomialTree().schedule(4, collective=Collective.ALL_REDUCE)
    with pytest.raises(ValueError, match="chunks must be a positive integer"):
        PipelinedChain(chunks=0)


def test_choice_by_size():
    assert isinstance(choose(16, TREE_MAX_BYTES), BinomialTree)
    big = choose(16, 64 << 20)
    assert isinstance(big, PipelinedChain) and big.chunks == 64
    assert isinstance(choose(2, 64 << 20), BinomialTree)


def test_checker_catches_broken_broadcasts():
    def sched(steps, p=3):
        return Schedule(
            "bad", Collective.BROADCAST, p, tuple(range(p)), 1, tuple(steps), owners=(0,)
        )

    # rank 2 never receives
    s = sched([Step.of([Op(OpKind.SEND, 0, 1, 0, 1), Op(OpKind.RECV_COPY, 1, 0, 0, 1)])])
    assert "rank 2, chunk 0: ends with undefined data" in str(s.check())
    # rank 1 forwards before it has the data
    s = sched(
        [
            Step.of(
                [
                    Op(OpKind.SEND, 1, 2, 0, 1),
                    Op(OpKind.RECV_COPY, 2, 1, 0, 1),
                    Op(OpKind.SEND, 0, 1, 0, 1),
                    Op(OpKind.RECV_COPY, 1, 0, 0, 1),
                ]
            )
        ]
    )
    assert "rank 1 sends chunk 0 to rank 2 before it holds any data" in str(s.check())
    # a reduction mixes in a non-root's (undefined) buffer
    s = sched(
        [
            Step.of(
                [
                    Op(OpKind.SEND, 0, 1, 0, 1),
                    Op(OpKind.RECV_REDUCE, 1, 0, 0, 1),
                    Op(OpKind.SEND, 0, 2, 0, 1),
                    Op(OpKind.RECV_COPY, 2, 0, 0, 1),
                ]
            )
        ]
    )
    assert "reduces into undefined data" in str(s.check())


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [2, 3, 4])
@pytest.mark.slow
def test_broadcast_matches_mpi_bcast_and_torch_distributed(nranks, tmp_path):
    out = tmp_path / "report.json"
    mpiexec(nranks, "broadcast_worker.py", out, timeout=300)
    report = json.loads(out.read_text())
    # 2 transports x 3 sizes x 2 roots x 3 algorithms (auto, tree, chain), on every rank
    assert report["cases"] == 2 * 3 * 2 * 3 * nranks
    assert report["failures"] == [], json.dumps(report["failures"][:5], indent=1)
