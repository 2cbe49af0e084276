"""Symbolic checks of every schedule, and of the checker itself."""

import dataclasses

import pytest

from commrt.algorithms import HalvingDoubling, RecursiveDoubling, Ring, resolve
from commrt.algorithms.fragments import ring_reduce_scatter, split_block
from commrt.errors import ScheduleError
from commrt.schedule import Collective, Op, OpKind, Schedule, Step, check, chunk_bounds, parallel

WORLD_SIZES = range(1, 65)
ALL_REDUCE_ALGORITHMS = [Ring(), HalvingDoubling(), RecursiveDoubling()]


@pytest.mark.parametrize("alg", ALL_REDUCE_ALGORITHMS, ids=str)
def test_all_reduce_schedules_are_correct_for_p_1_to_64(alg):
    for p in WORLD_SIZES:
        report = alg.schedule(p).check()
        assert report.ok, str(report)


@pytest.mark.parametrize("collective", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
def test_ring_reduce_scatter_and_all_gather_for_p_1_to_64(collective):
    for p in WORLD_SIZES:
        s = Ring().schedule(p, collective=collective)
        assert s.check().ok, str(s.check())
        assert s.num_steps == p - 1


def test_step_counts():
    for p in (2, 3, 4, 8, 13, 64):
        assert Ring().schedule(p).num_steps == 2 * (p - 1)
    assert HalvingDoubling().schedule(8).num_steps == 6  # 2 log2 8
    assert HalvingDoubling().schedule(6).num_steps == 2 * 2 + 2  # core of 4, fold-in/out
    for p in range(1, 65):
        q = 1 << (p.bit_length() - 1)
        rd = RecursiveDoubling().schedule(p)
        assert rd.num_steps == q.bit_length() - 1 + 2 * (p > q)  # log2 q, + fold-in/out
        assert rd.num_chunks == 1 and rd.messages() == (q.bit_length() - 1) * q + 2 * (p - q)


def test_recursive_doubling_folds_like_halving_doubling():
    # the extras (ranks 4, 5 of 6) fold in and out through the same fragments, on the same
    # partners; only the chunk range differs (one chunk here, q chunks there)
    rd, hd = RecursiveDoubling().schedule(6), HalvingDoubling().schedule(6)
    for i in (0, -1):
        a, b = rd.steps[i], hd.steps[i]
        assert a.phase == b.phase and [(o.kind, o.rank, o.peer) for o in a.ops] == [
            (o.kind, o.rank, o.peer) for o in b.ops
        ]
    # core steps: partner = position XOR 2^k, whole buffer, send and add
    assert [str(o) for o in rd.steps[2].ops_of(1)] == ["c0→3", "c0+←3"]
    assert resolve("rd") == resolve("recursive-doubling") == RecursiveDoubling()
    with pytest.raises(ValueError, match="all_reduce only"):
        RecursiveDoubling().schedule(4, collective=Collective.REDUCE_SCATTER)


@pytest.mark.parametrize("alg", ALL_REDUCE_ALGORITHMS, ids=str)
def test_subset_schedules(alg):
    ranks = (5, 1, 7, 2, 9)
    s = alg.schedule(12, ranks=ranks)
    assert s.world_size == 12 and s.ranks == ranks
    assert s.check().ok, str(s.check())
    assert {o.rank for st in s.steps for o in st.ops} <= set(ranks)


def test_subset_validation():
    with pytest.raises(ValueError, match="outside"):
        Ring().schedule(4, ranks=(0, 4))
    with pytest.raises(ValueError, match="distinct"):
        Ring().schedule(4, ranks=(0, 0))
    with pytest.raises(ValueError, match="world_size"):
        Ring().schedule(0)


def _replace_step(s: Schedule, i: int, ops) -> Schedule:
    steps = list(s.steps)
    steps[i] = Step.of(ops, steps[i].phase)
    return dataclasses.replace(s, steps=tuple(steps))


def test_checker_reports_unmatched_send():
    s = Ring().schedule(4)
    ops = [o for o in s.steps[2].ops if not (o.rank == 3 and o.kind.is_recv)]
    r = check(_replace_step(s, 2, ops))
    assert not r.ok
    assert (
        "step 2: rank 2 sends chunks [0,1) to rank 3, which posts no matching receive"
        in r.errors[0]
    )
    with pytest.raises(ScheduleError, match="rank 2 sends"):
        r.raise_if_failed()


def test_checker_reports_a_receive_without_a_send_instead_of_crashing():
    s = Ring().schedule(4)
    ops = [o for o in s.steps[2].ops if not (o.rank == 2 and o.kind is OpKind.SEND)]
    r = check(_replace_step(s, 2, ops))  # raised KeyError before
    assert not r.ok
    assert (
        "step 2: rank 3 receives chunks [0,1) from rank 2, which sends no such chunks" in r.errors
    )


def test_checker_reports_double_counting_and_self_wait():
    s = Ring().schedule(3)
    doubled = s.steps[0].ops + (Op(OpKind.SEND, 0, 1, 0, 1), Op(OpKind.RECV_REDUCE, 1, 0, 0, 1))
    r = check(_replace_step(s, 0, doubled))
    assert any("rank 1, chunk 0: adds contributions of ranks {0} twice" in e for e in r.errors), (
        r.errors
    )
    selfish = s.steps[0].ops + (Op(OpKind.SEND, 2, 2, 0, 1), Op(OpKind.RECV_REDUCE, 2, 2, 0, 1))
    assert "rank 2 waits on itself" in check(_replace_step(s, 0, selfish)).errors[0]


def test_checker_names_first_rank_and_chunk_that_go_wrong():
    s = Ring().schedule(4)
    truncated = dataclasses.replace(s, steps=s.steps[:-1])  # drop the last all-gather step
    r = check(truncated)
    assert not r.ok
    # after 5 of 6 steps rank 0 still lacks chunk 2
    assert r.errors[0].startswith(
        "rank 0, chunk 2: ends with contributions of ranks {0,2,3} (missing {1})"
    )
    assert "needs {0,1,2,3}" in r.errors[0]


def test_checker_rejects_sending_undefined_data_in_all_gather():
    s = Ring().schedule(3, collective=Collective.ALL_GATHER)
    wrong = dataclasses.replace(s, owners=tuple(reversed(s.owners)))
    r = check(wrong)
    assert not r.ok and "before it holds any data" in r.errors[0]


def test_checker_span_and_outside_ranks():
    # a fragment that reduces only chunks [2,4) of 6 over ranks 1 and 3 of 4
    steps, _ = ring_reduce_scatter((1, 3), split_block((2, 4), 2))
    s = Schedule(
        "frag",
        Collective.REDUCE_SCATTER,
        4,
        (1, 3),
        6,
        steps,
        owners=(None, None, 3, 1, None, None),
        span=(2, 4),
    )
    assert s.check().ok, str(s.check())
    bad = _replace_step(s, 0, steps[0].ops + (Op(OpKind.SEND, 0, 1, 2, 3),))
    assert "names a rank outside" in check(bad).errors[0]
    outside = _replace_step(
        s, 0, steps[0].ops + (Op(OpKind.SEND, 1, 3, 4, 5), Op(OpKind.RECV_COPY, 3, 1, 4, 5))
    )
    assert "outside [2, 4)" in check(outside).errors[0]


def test_parallel_merges_disjoint_fragments():
    a, _ = ring_reduce_scatter((0, 1), [(0, 1), (1, 2)], phase="row")
    b, _ = ring_reduce_scatter((2, 3, 4), [(0, 1), (1, 2), (2, 3)], phase="row")
    merged = parallel([a, b])
    assert len(merged) == 2
    assert len(merged[0].ops) == len(a[0].ops) + len(b[0].ops)
    assert len(merged[1].ops) == len(b[1].ops) and merged[1].phase == "row"


def test_table_is_readable():
    text = str(Ring().schedule(4))
    lines = text.splitlines()
    assert lines[0] == "ring all_reduce · 4 ranks · 4 chunks · 6 steps"
    assert lines[1].split() == ["step", "phase", "r0", "r1", "r2", "r3"]
    assert lines[2].split()[:4] == ["0", "reduce-scatter", "c0→1", "c3+←3"]
    assert "c0=←3" in lines[5]
    big = Ring().schedule(20).table(max_ranks=4, max_steps=3)
    assert "… 16 more ranks not shown" in big and "… 35 more steps not shown" in big


@pytest.mark.parametrize("numel,k", [(0, 4), (3, 4), (10, 4), (1_000_003, 7), (64, 64)])
def test_chunk_bounds_cover_the_buffer(numel, k):
    b = chunk_bounds(numel, k)
    assert b[0] == 0 and b[-1] == numel and len(b) == k + 1
    sizes = [b[i + 1] - b[i] for i in range(k)]
    assert max(sizes) - min(sizes) <= 1


def test_resolve_names_and_errors():
    assert resolve("ring") == Ring() and resolve("hd") == HalvingDoubling()
    assert resolve(Ring()) == Ring()
    with pytest.raises(ValueError, match="unknown algorithm 'rnig'; choose one of"):
        resolve("rnig")
    with pytest.raises(TypeError):
        resolve(3)
    with pytest.raises(ValueError, match="needs a power-of-two number of ranks"):
        HalvingDoubling().schedule(6, collective=Collective.ALL_GATHER)
    with pytest.raises(ValueError, match="does not implement gossip"):
        HalvingDoubling().schedule(4, collective=Collective.GOSSIP)
