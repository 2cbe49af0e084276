"""Torus2D: symbolic checks for every grid with p <= 64, step counts, shape rules,
the executor on the in-process transport, and real processes (mpi and gloo)."""

import json
import time
import types

import pytest
import torch
from helpers.local_transport import run_ranks
from helpers.mp import mpiexec
from helpers.torus import assert_executor_exact

from commrt.algorithms import Ring, Torus2D, resolve
from commrt.algorithms.torus import square_shape
from commrt.schedule import Collective


def grids(p):
    return [(r, p // r) for r in range(1, p + 1) if p % r == 0]


# ------------------------------------------------------------------ symbolic


@pytest.mark.slow
def test_every_grid_shape_up_to_64_is_a_correct_all_reduce():
    n = 0
    for p in range(1, 65):
        for rows, cols in grids(p):
            s = Torus2D(rows, cols).schedule(p)
            report = s.check()
            assert report.ok, f"{rows}×{cols}: {report}"
            n += 1
    assert n == sum(len(grids(p)) for p in range(1, 65)) == 280


@pytest.mark.parametrize("collective", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
def test_reduce_scatter_and_all_gather(collective):
    for p in list(range(1, 25)) + [36, 48, 64]:
        for rows, cols in grids(p):
            s = Torus2D(rows, cols).schedule(p, collective=collective)
            assert s.check().ok, f"{rows}×{cols}: {s.check()}"
            assert s.num_steps == (cols - 1) + (rows - 1)
            assert sorted(s.owners) == sorted(list(s.ranks))  # one chunk per rank


def test_step_count_is_2x_minus_1_plus_2y_minus_1_against_the_rings_2p_minus_1():
    for p in range(1, 65):
        ring = Ring().schedule(p).num_steps
        assert ring == 2 * (p - 1)
        for rows, cols in grids(p):
            assert Torus2D(rows, cols).schedule(p).num_steps == 2 * (cols - 1) + 2 * (rows - 1)
    assert Torus2D(2, 2).schedule(4).num_steps == 4 and Ring().schedule(4).num_steps == 6
    assert Torus2D(8, 8).schedule(64).num_steps == 28 and Ring().schedule(64).num_steps == 126


def test_phases_in_order_and_bytes_equal_the_ring():
    s = Torus2D(2, 3).schedule(6)
    assert [st.phase for st in s.steps] == ["row reduce-scatter"] * 2 + [
        "column reduce-scatter",
        "column all-gather",
    ] + ["row all-gather"] * 2
    for p, shape in ((6, (2, 3)), (12, (3, 4)), (64, (8, 8))):
        t, r = Torus2D(*shape).schedule(p), Ring().schedule(p)
        # chunks sent per rank: the same 2(p-1) chunks of n/p as the ring
        for rank in (0, p - 1):
            sent = lambda sch: sum(o.hi - o.lo for sends, _ in sch.program(rank) for o in sends)  # noqa: E731, B023
            assert sent(t) == sent(r) == 2 * (p - 1)


@pytest.mark.parametrize("p", [2, 3, 5, 7, 13, 31])
def test_prime_p_degenerates_to_the_ring(p):
    assert Torus2D().shape(p) == (1, p)
    t, r = Torus2D().schedule(p), Ring().schedule(p)
    assert t.num_steps == r.num_steps == 2 * (p - 1)
    for a, b in zip(t.steps, r.steps):  # the very same messages
        assert [(o.kind, o.rank, o.peer, o.lo, o.hi) for o in a.ops] == [
            (o.kind, o.rank, o.peer, o.lo, o.hi) for o in b.ops
        ]
    assert Torus2D(p, 1).schedule(p).num_steps == 2 * (p - 1)  # one column: a ring too


def test_subsets_of_ranks():
    for ranks, shape in (
        ((5, 1, 7, 2), (2, 2)),
        ((9, 0, 3, 4, 8, 11), (2, 3)),
        ((9, 0, 3, 4, 8, 11), (3, 2)),
        ((2, 4, 6), (1, 3)),
    ):
        s = Torus2D(*shape).schedule(12, ranks=ranks)
        assert s.world_size == 12 and s.ranks == ranks
        assert s.check().ok, str(s.check())
        assert {o.rank for st in s.steps for o in st.ops} <= set(ranks)
    with pytest.raises(ValueError, match="p=4 ranks"):
        Torus2D(2, 3).schedule(12, ranks=(0, 1, 2, 3))


def test_large_grids_build_lazily():
    t0 = time.perf_counter()
    s = Torus2D(64, 64).schedule(4096)
    assert time.perf_counter() - t0 < 1.0
    assert s.num_steps == 252
    st = s.steps[100]
    assert st.phase == "column reduce-scatter" and len(st) == 2 * 4096


# ------------------------------------------------------------------ shape rules


def test_validation_errors_say_why():
    for bad in (0, -2, 2.0, "2", True):
        with pytest.raises(ValueError, match="positive integer or None"):
            Torus2D(rows=bad)
        with pytest.raises(ValueError, match="positive integer or None"):
            Torus2D(cols=bad)
    with pytest.raises(
        ValueError,
        match=r"grid 2×3 has 6 ranks but p=4 ranks take part \(rows=2, cols=3\).*"
        r"1×4, 2×2, 4×1",
    ):
        Torus2D(2, 3).schedule(4)
    with pytest.raises(ValueError, match="rows=3 does not divide p=4 ranks.*1×4, 2×2, 4×1"):
        Torus2D(rows=3).schedule(4)
    with pytest.raises(ValueError, match="cols=4 does not divide p=6"):
        Torus2D(cols=4).select(6, 1024, types.SimpleNamespace(local_size=2))


def test_default_shape_rule():
    t = Torus2D()
    assert [square_shape(p) for p in (1, 4, 6, 8, 12, 16, 7, 64)] == [
        (1, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (3, 4),
        (4, 4),
        (1, 7),
        (8, 8),
    ]
    assert t.shape(12) == (3, 4)
    assert t.shape(8, local_size=4) == (2, 4)  # a row per node: 2 nodes of 4
    assert t.shape(12, local_size=2) == (6, 2)
    assert t.shape(8, local_size=8) == (2, 4)  # one node: most square
    assert t.shape(8, local_size=1) == (2, 4)  # one rank per node: most square
    assert t.shape(12, local_size=5) == (3, 4)  # does not divide: most square
    assert Torus2D(rows=3).shape(12, local_size=2) == (3, 4)  # explicit wins
    assert Torus2D(cols=6).shape(12) == (2, 6)


def test_select_uses_the_communicators_local_size():
    comm = types.SimpleNamespace(local_size=2)
    s = Torus2D().select(8, 1 << 20, comm)
    assert s.name == "torus2d" and s.check().ok
    assert s is Torus2D(4, 2).schedule(8)  # cached per shape
    assert Torus2D().select(8, 1, None) is Torus2D(2, 4).schedule(8)
    assert Torus2D(1, 8).select(8, 1, comm) is Torus2D(1, 8).schedule(8)
    assert resolve("torus2d") == Torus2D() and resolve("Torus2D") == Torus2D()
    assert str(Torus2D()) == "torus2d" and str(Torus2D(2, 3)) == "torus2d(2×3)"


def test_table_and_describe():
    text = Torus2D().describe(6)
    lines = text.splitlines()
    assert lines[0] == "torus2d 2×3 grid: rows [0 1 2] [3 4 5] · columns [0 3] [1 4] [2 5]"
    assert lines[1] == "torus2d all_reduce · 6 ranks · 6 chunks · 6 steps"
    assert lines[2].split() == ["step", "phase", "r0", "r1", "r2", "r3", "r4", "r5"]
    assert lines[3].split()[:5] == ["0", "row", "reduce-scatter", "c0-1→1", "c4-5+←2"]
    assert lines[5].split()[:5] == ["2", "column", "reduce-scatter", "c2→3", "c3+←3"]
    assert (
        Torus2D().describe(8, local_size=4).startswith("torus2d 2×4 grid: rows [0 1 2 3] [4 5 6 7]")
    )


# ------------------------------------------------------------------ executor, in process


@pytest.mark.parametrize(
    "shape",
    [(1, 1), (2, 2), (2, 3), (3, 2), (1, 5), (5, 1), (2, 4), (3, 3)],
    ids=lambda s: f"{s[0]}x{s[1]}",
)
def test_executor_exact(shape):
    assert_executor_exact(Torus2D(*shape).schedule(shape[0] * shape[1]), piece_bytes=1024)


# ------------------------------------------------------------------ real processes


@pytest.mark.mpi
@pytest.mark.parametrize("nranks,shapes", [(4, "2x2,1x4,2x2s3,2x2s2r"), (6, "2x3,3x2,3x2s4")])
@pytest.mark.slow
def test_torus_matches_ring_mpi_and_gloo(nranks, shapes, tmp_path):
    out = tmp_path / "report.json"
    mpiexec(nranks, "torus_worker.py", out, shapes, timeout=600)
    report = json.loads(out.read_text())
    assert report["world_size"] == nranks
    # default shape under mpiexec on one machine (local_size == p): the most square grid
    assert report["default_shape"] == list(square_shape(nranks))
    assert report["bad_shape_errors"] == [True] * nranks
    # 2 transports x algorithms (the grids, pipelined ones too, "torus2d", ring) x 2 ops x 4 sizes
    # x 3 dtypes, per rank
    algorithms = len(shapes.split(",")) + 2
    assert report["cases"] == 2 * algorithms * 2 * 4 * 3 * nranks
    assert report["failures"] == [], json.dumps(report["failures"][:5], indent=1)


@pytest.mark.parametrize(
    "local_sizes, local_ranks, shape",
    [
        ([2] * 8, [r % 2 for r in range(8)], (4, 2)),  # 4 nodes of 2: a row per node
        ([2] * 7 + [4], [r % 2 for r in range(8)], (2, 4)),  # one rank disagrees: square everywhere
        ([2] * 8, [r // 4 for r in range(8)], (2, 4)),  # not in blocks (round robin): square
        ([None] * 8, [0] * 8, (2, 4)),  # launcher silent: square
    ],
)
def test_default_grid_is_agreed_by_every_rank(local_sizes, local_ranks, shape, monkeypatch):
    from commrt.process.environment import LaunchInfo
    from commrt.runtime.choice import Backend
    from commrt.runtime.communicator import Communicator
    from commrt.tuning.hook_comm import HookComm
    from commrt.tuning.topology import ranks_per_node

    # these "ranks" are threads of this process: keep the communicators from fitting the
    # test process's torch threads to a node of local_sizes ranks (commrt.process.threads)
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))

    def body(tr):
        launch = LaunchInfo("torchrun", tr.rank, 8, local_ranks[tr.rank], local_sizes[tr.rank])
        comm = Communicator(tr, Backend.GLOO, launch, 10.0, 1 << 20)
        return Torus2D().select(8, 4096, HookComm(comm)), ranks_per_node(comm)

    want = Torus2D(*shape).schedule(8)
    for sched, per_node in run_ranks(8, body):
        # the same program, not the same object: threads that miss the schedule cache at once
        # each build their own (lru_cache computes concurrent misses twice)
        assert [sched.program(r) for r in range(8)] == [want.program(r) for r in range(8)]
        assert per_node == (2 if shape == (4, 2) else None)
