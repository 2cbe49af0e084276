"""PipelinedTorus2D: symbolic checks, the overlap it promises, the executor on the in-process
transport, and its price in the simulator. Real processes (mpi and gloo, against a float64
reference): tests/multiprocess/test_torus.py::test_torus_matches_ring_mpi_and_gloo."""

import types

import pytest
from helpers.torus import assert_executor_exact

from commrt import sim
from commrt.algorithms import PipelinedTorus2D, Torus2D, resolve
from commrt.algorithms.fragments import direct_all_gather, direct_reduce_scatter
from commrt.algorithms.pipelined_torus import segments_for
from commrt.schedule import Collective, Schedule, Steps
from commrt.schedule.plan import compile_plan

ROW, COLUMN = (
    ("row reduce-scatter", "row all-gather"),
    ("column reduce-scatter", "column all-gather"),
)


def grids(p):
    return [(r, p // r) for r in range(1, p + 1) if p % r == 0]


def depth(rows, cols, direct):
    return 2 * (cols - 1) + ((2 if rows > 1 else 0) if direct else 2 * (rows - 1))


# ------------------------------------------------------------------ symbolic


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.slow
def test_every_grid_and_segment_count_is_a_correct_all_reduce(direct):
    for p in list(range(1, 17)) + [24, 36]:
        for rows, cols in grids(p):
            for seg in (1, 2, 3, 5, 8):
                s = PipelinedTorus2D(rows, cols, seg, direct).schedule(p)
                assert s.check().ok, f"{rows}×{cols} s{seg}: {s.check()}"
                d = depth(rows, cols, direct)
                assert s.num_steps == (d + seg - 1 if d else 0), (rows, cols, seg)
                assert s.num_chunks == seg * p


def test_one_segment_with_ring_columns_is_the_torus():
    for rows, cols in [(2, 3), (4, 2), (1, 5)]:
        a = PipelinedTorus2D(rows, cols, 1, False).schedule(rows * cols)
        b = Torus2D(rows, cols).schedule(rows * cols)
        assert [st.ops for st in a.steps] == [st.ops for st in b.steps]


def test_direct_fragments_alone():
    ranks, blocks = (3, 5, 9), [(0, 2), (2, 3), (3, 6)]
    rs, holder = direct_reduce_scatter(ranks, blocks)
    assert len(rs) == 1 and holder == {0: 3, 1: 5, 2: 9}
    steps = Steps.chain([rs, direct_all_gather(ranks, blocks)])
    s = Schedule("direct", Collective.ALL_REDUCE, 10, ranks, 6, steps)
    assert s.check().ok, s.check()
    assert [str(o) for o in rs[0].ops_of(3)] == ["c2→5", "c0-1+←5", "c3-5→9", "c0-1+←9"]
    assert len(direct_reduce_scatter((4,), [(0, 1)])[0]) == 0  # alone: nothing to do


def test_rows_overlap_columns_and_bytes_equal_the_torus():
    """The point of the pipeline: steps where a rank sends row (intra-node) and column
    (network) traffic at once, column ops first; each rank sends what the torus sends."""
    p, n = 8, 1 << 20
    for direct in (True, False):
        s = PipelinedTorus2D(4, 2, 4, direct).schedule(p)
        mixed = [st for st in s.steps if any(r in st.phase for r in ROW)]
        mixed = [st for st in mixed if any(c in st.phase for c in COLUMN)]
        assert len(mixed) >= 2, s.table()
        for st in s.steps:  # within a step every rank's column ops come before its row ops
            for r in range(p):
                kinds = [(o.peer // 2 == r // 2) for o in st.ops_of(r)]  # same host: a row op
                assert kinds == sorted(kinds), (st.phase, r)
        for r in range(p):
            ours = compile_plan(s, r, n, 1 << 30).send_elems
            assert ours == compile_plan(Torus2D(4, 2).schedule(p), r, n, 1 << 30).send_elems


def test_validation_errors_say_why():
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="segments must be a positive integer"):
            PipelinedTorus2D(segments=bad)
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        PipelinedTorus2D(rows=0)
    with pytest.raises(ValueError, match="direct must be True, False or None"):
        PipelinedTorus2D(direct="yes")
    with pytest.raises(ValueError, match="rows × cols must equal p"):
        PipelinedTorus2D(3, 3).schedule(8)
    with pytest.raises(ValueError, match="all_reduce only"):
        PipelinedTorus2D().schedule(4, collective=Collective.REDUCE_SCATTER)
    assert not PipelinedTorus2D().supports(Collective.ALL_GATHER)


def test_select_takes_a_row_per_node_and_segments_by_size():
    comm = types.SimpleNamespace(local_size=2)
    sizes = (0, 1 << 20, 3 << 20, 4 << 20, 16 << 20, 64 << 20, 1 << 30)
    assert [segments_for(n) for n in sizes] == [1, 1, 3, 4, 16, 16, 16]
    s = PipelinedTorus2D().select(8, 4 << 20, comm)
    assert s is PipelinedTorus2D(4, 2, 4).schedule(8) and s.num_chunks == 32
    # ring columns unless asked (module doc: measured faster on 4 hosts × 2 ranks)
    assert s.num_steps == PipelinedTorus2D(4, 2, 4, False).schedule(8).num_steps == 11
    assert PipelinedTorus2D(4, 2, 4, True).schedule(8).num_steps == 7
    assert PipelinedTorus2D(segments=3).select(8, 64 << 20, comm).num_chunks == 24
    assert PipelinedTorus2D().select(8, 64 << 20).num_chunks == 16 * 8  # square grid: 2×4
    assert resolve("torus2d_pipelined") == PipelinedTorus2D()
    assert str(PipelinedTorus2D(4, 2, 8, False)) == "torus2d_pipelined(4x2,s8,ring)"


# ------------------------------------------------------------------ executor


@pytest.mark.parametrize(
    "rows,cols,seg,direct",
    [(2, 2, 3, True), (2, 2, 2, False), (4, 2, 4, None), (1, 3, 2, None), (3, 2, 5, True)],
)
def test_executor_exact(rows, cols, seg, direct):
    assert_executor_exact(PipelinedTorus2D(rows, cols, seg, direct).schedule(rows * cols), 256)


# ------------------------------------------------------------------ simulator


@pytest.mark.parametrize(
    "rows,cols,seg,direct", [(4, 2, 8, None), (3, 4, 4, False), (8, 8, 16, None)]
)
def test_closed_form_matches_the_replay_on_one_link_class(rows, cols, seg, direct):
    alg, p = PipelinedTorus2D(rows, cols, seg, direct), rows * cols
    net = sim.Network.flat(alpha_s=30e-6, beta_s_per_byte=1 / 5e9)
    for n in (1 << 16, 64 << 20):
        replay = sim.simulate(alg, p, n, network=net).time_s
        assert sim.closed_form(alg, p, n, net.inter) == pytest.approx(replay, rel=0.01)
        # on one link class nothing overlaps: the ring-column torus never beats Torus2D
        if direct is False:
            assert replay > sim.simulate(Torus2D(rows, cols), p, n, network=net).time_s


def test_two_tiers_the_rows_hide_under_the_columns():
    """4 nodes × 2 ranks, a fast tier 2× the NIC (as the probe measured on the namespace
    hosts): the pipelined torus approaches the columns' own time, the torus pays the rows."""
    net = sim.Network(sim.Link(1e-3, 1 / 0.2e9), sim.Link(1.5e-3, 1 / 0.12e9), 2, 1)
    n = 64 << 20
    torus = sim.simulate(Torus2D(4, 2), 8, n, network=net).time_s
    piped = sim.simulate(PipelinedTorus2D(4, 2, 16), 8, n, network=net).time_s
    floor = 2 * 3 / 4 * n / 0.12e9  # each node's bytes off the node, through its one NIC
    assert floor < piped < 1.1 * floor < torus
    assert sim.estimate(PipelinedTorus2D(4, 2, 16), 8, n, net) == piped
