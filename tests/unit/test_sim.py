"""The simulator: closed-form validation up to p = 4096, link classes, NIC sharing, stragglers."""

import dataclasses
import math
import os
import time

import numpy as np
import pytest

from commrt import sim
from commrt.algorithms import HalvingDoubling, RecursiveDoubling, Ring, Torus2D
from commrt.schedule import Collective, Op, OpKind, Schedule, Step

FLAT = sim.Network.flat(alpha_s=5e-6, beta_s_per_byte=1 / 12.5e9)
P_VALIDATE = [2, 4, 8, 64, 512, 4096]


def _within(got: float, want: float, rel: float = 0.01) -> bool:
    return abs(got - want) <= rel * want


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("p", P_VALIDATE)
def test_ring_matches_closed_form(p):
    nbytes = 4 * p * 1024  # divisible: every chunk the same size
    link = FLAT.inter
    want = 2 * (p - 1) * link.alpha_s + 2 * (p - 1) / p * nbytes * link.beta_s_per_byte
    t0 = time.perf_counter()
    got = sim.simulate(Ring(), p, nbytes, network=FLAT).time_s
    assert _within(got, want), (got, want)
    assert time.perf_counter() - t0 < 30  # 8190 steps x 8192 ops: ~1-2 s unloaded


@pytest.mark.parametrize("p", P_VALIDATE)
def test_halving_doubling_matches_closed_form(p):
    nbytes = 4 * p * 1024
    link = FLAT.inter
    want = 2 * math.log2(p) * link.alpha_s + 2 * (p - 1) / p * nbytes * link.beta_s_per_byte
    assert _within(sim.simulate(HalvingDoubling(), p, nbytes, network=FLAT).time_s, want)


@pytest.mark.parametrize("p", P_VALIDATE)
def test_torus_matches_closed_form(p):
    nbytes = 4 * p * 1024
    rows, cols = Torus2D().shape(p)
    link = FLAT.inter
    want = 2 * (rows + cols - 2) * link.alpha_s + 2 * (p - 1) / p * nbytes * link.beta_s_per_byte
    got = sim.simulate(Torus2D(rows, cols), p, nbytes, network=FLAT).time_s
    assert _within(got, want), (rows, cols, got, want)
    assert got == pytest.approx(sim.torus_time(rows, cols, nbytes, link), rel=1e-9)


@pytest.mark.parametrize("shape", [(2, 32), (32, 2), (4, 16), (1, 64)])
def test_torus_any_shape_and_uneven_sizes(shape):
    p = 64
    for nbytes in (4 * p * 1000, 4 * 1_000_003):  # the second is not divisible by 64 chunks
        got = sim.simulate(Torus2D(*shape), p, nbytes, network=FLAT).time_s
        assert _within(got, sim.torus_time(*shape, nbytes, FLAT.inter)), (shape, nbytes)


def test_non_power_of_two_halving_doubling_and_closed_form_helper():
    for p in (3, 6, 12, 100):
        nbytes = 4 * 1024 * 128
        got = sim.simulate("hd", p, nbytes, network=FLAT).time_s
        assert _within(got, sim.halving_doubling_time(p, nbytes, FLAT.inter)), p
        assert sim.closed_form("hd", p, nbytes, FLAT.inter) == sim.halving_doubling_time(
            p, nbytes, FLAT.inter
        )
    assert sim.closed_form(Torus2D(3, 4), 12, 4096, FLAT.inter) == sim.torus_time(
        3, 4, 4096, FLAT.inter
    )


@pytest.mark.parametrize("p", P_VALIDATE + [3, 6, 12, 100])
def test_recursive_doubling_matches_closed_form(p):
    nbytes = 4 * 1024 * 128
    got = sim.simulate(RecursiveDoubling(), p, nbytes, network=FLAT)
    q = 1 << (p.bit_length() - 1)
    want = (math.log2(q) + 2 * (p > q)) * FLAT.inter.time(nbytes)
    assert got.time_s == pytest.approx(want, rel=1e-9)
    assert sim.closed_form("rd", p, nbytes, FLAT.inter) == pytest.approx(want, rel=1e-12)
    # every core step carries the whole buffer each way
    busy = got.step_messages > 0
    assert set(got.step_bytes[busy] // got.step_messages[busy]) == {nbytes}


GAMMA = dataclasses.replace(FLAT, gamma_s_per_byte=1 / 6e9)


@pytest.mark.parametrize(
    "alg,p",
    [
        (Ring(), 8),
        (Ring(), 5),
        (HalvingDoubling(), 16),
        (HalvingDoubling(), 12),
        (RecursiveDoubling(), 16),
        (RecursiveDoubling(), 12),
        (Torus2D(4, 4), 16),
        (Torus2D(3, 4), 12),
    ],
    ids=str,
)
def test_reduction_time_gamma_replays_as_the_closed_forms_say(alg, p):
    nbytes = 4 * 1024 * p  # every chunk the same size
    got = sim.simulate(alg, p, nbytes, network=GAMMA).time_s
    want = sim.closed_form(alg, p, nbytes, GAMMA.inter, GAMMA.gamma_s_per_byte)
    assert _within(got, want), (got, want)
    assert got > sim.simulate(alg, p, nbytes, network=FLAT).time_s  # adding costs time
    assert sim.estimate(alg, p, nbytes, GAMMA) == want
    # the per-sample dataflow replay adds the same reduction time
    flow = sim.simulate_steps(alg, p, nbytes, GAMMA, samples=2, dataflow=True)
    assert flow.mean_s == pytest.approx(got, rel=1e-9)


def test_gamma_is_validated_and_saved():
    with pytest.raises(ValueError, match="gamma_s_per_byte"):
        dataclasses.replace(FLAT, gamma_s_per_byte=-1.0)
    assert sim.Network.from_dict(GAMMA.to_dict()) == GAMMA
    probed = sim.Network.from_dict(
        {"alpha_s": 5e-6, "beta_s_per_byte": 1e-9, "gamma_s_per_byte": 2e-10}
    )
    assert probed.gamma_s_per_byte == 2e-10 and "adds at 5 GB/s" in probed.describe()


# ----------------------------------------------------------------------------- link classes
H100 = sim.Network.h100_nvlink_ib()


def test_one_node_uses_the_intra_class():
    p, nbytes = 8, 8 << 20
    got = sim.simulate("ring", p, nbytes, network=H100).time_s
    assert got == pytest.approx(sim.ring_time(p, nbytes, H100.intra), rel=1e-9)


def test_ring_over_nodes_is_paced_by_the_one_off_node_link_per_node():
    # 8 nodes x 8 ranks: in every ring step one rank per node sends off-node.
    p, nbytes = 64, 4 * 64 * 4096
    got = sim.simulate("ring", p, nbytes, network=H100).time_s
    assert _within(got, sim.ring_time(p, nbytes, H100.inter))


def test_torus_with_rows_on_nodes_splits_into_nvlink_rows_and_ib_columns():
    p, nbytes = 64, 4 * 64 * 4096
    Y, X = 8, 8  # one row per node
    i, e = H100.intra, H100.inter
    want = 2 * (X - 1) * i.time(nbytes / X) + 2 * (Y - 1) * e.time(nbytes / p)
    r = sim.simulate(Torus2D(Y, X), p, nbytes, network=H100)
    assert _within(r.time_s, want)
    phases = r.by_phase()
    assert list(phases) == [
        "row reduce-scatter",
        "column reduce-scatter",
        "column all-gather",
        "row all-gather",
    ]
    assert phases["column reduce-scatter"][1] == pytest.approx(
        (Y - 1) * e.time(nbytes / p), rel=1e-6
    )


def _one_step(p: int, pairs, chunks: int) -> Schedule:
    ops = []
    for a, b in pairs:
        ops += [Op(OpKind.SEND, a, b, 0, 1), Op(OpKind.RECV_COPY, b, a, 0, 1)]
    return Schedule(
        "pairs", Collective.ALL_REDUCE, p, tuple(range(p)), chunks, (Step.of(ops, "x"),)
    )


@pytest.mark.parametrize("nics,expect_share", [(1, 4), (2, 2), (4, 1), (8, 1)])
def test_nic_sharing_when_several_ranks_of_a_node_go_off_node(nics, expect_share):
    # 2 nodes of 4: ranks 0-3 each send one chunk to 4-7 at once.
    net = sim.Network(
        sim.Link(1e-6, 1e-10), sim.Link(5e-6, 1e-9), ranks_per_node=4, nics_per_node=nics
    )
    chunk = 1 << 20
    s = _one_step(8, [(r, r + 4) for r in range(4)], chunks=1)
    got = sim.simulate(s, nbytes=chunk, network=net, itemsize=1).time_s
    assert got == pytest.approx(5e-6 + expect_share * chunk * 1e-9, rel=1e-9)


def test_intra_and_inter_traffic_of_one_rank_do_not_share_a_port():
    net = sim.Network(
        sim.Link(1e-6, 1e-10), sim.Link(5e-6, 1e-9), ranks_per_node=2, nics_per_node=1
    )
    chunk = 1 << 20
    both = _one_step(4, [(0, 1), (0, 2)], chunks=1)  # rank 0: one intra, one inter message
    two_inter = _one_step(
        4, [(0, 2), (0, 3)], chunks=1
    )  # rank 0: two inter messages share its port
    t_both = sim.simulate(both, nbytes=chunk, network=net, itemsize=1).time_s
    t_two = sim.simulate(two_inter, nbytes=chunk, network=net, itemsize=1).time_s
    assert t_both == pytest.approx(5e-6 + chunk * 1e-9, rel=1e-9)
    assert t_two == pytest.approx(5e-6 + 2 * chunk * 1e-9, rel=1e-9)


def test_empty_chunks_send_nothing():
    # 8 bytes = 2 floats over 64 chunks: only the two non-empty chunks travel (the executor
    # skips empty ranges too), each still making its 2(p-1) hops one after another.
    r = sim.simulate("ring", 64, 8, network=FLAT)
    assert r.step_messages.max() == 2 and r.step_bytes.max() == 8
    assert r.time_s == pytest.approx(2 * 63 * FLAT.inter.time(4), rel=1e-9)


# ----------------------------------------------------------------------------- API
def test_simulate_takes_a_name_an_instance_or_a_schedule_and_breaks_down_per_step():
    p, nbytes = 16, 1 << 20
    by_name = sim.simulate("ring", p, nbytes, network=FLAT)
    by_inst = sim.simulate(Ring(), p, nbytes, network=FLAT)
    by_sched = sim.simulate(Ring().schedule(p), nbytes=nbytes, network=FLAT)
    assert by_name.time_s == by_inst.time_s == by_sched.time_s
    assert by_sched.num_steps == 2 * (p - 1) and len(by_sched.steps) == 2 * (p - 1)
    assert by_sched.step_time_s.sum() == pytest.approx(by_sched.time_s, rel=1e-12)
    assert by_sched.steps[0].messages == p and by_sched.steps[0].bytes == nbytes
    assert by_sched.busbw_gbps == pytest.approx(nbytes / by_sched.time_s / 1e9 * 2 * (p - 1) / p)
    assert "reduce-scatter" in by_sched.table() and "all-gather" in str(by_sched)
    assert sim.simulate("ring", 1, nbytes, network=FLAT).time_s == 0.0


@pytest.mark.parametrize("collective", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
def test_any_schedule_replays_including_reduce_scatter_all_gather_and_subsets(collective):
    p, nbytes = 16, 4 * 16 * 256
    r = sim.simulate(Ring().schedule(p, collective=collective), nbytes=nbytes, network=FLAT)
    want = (p - 1) * FLAT.inter.alpha_s + (p - 1) / p * nbytes * FLAT.inter.beta_s_per_byte
    assert r.time_s == pytest.approx(want, rel=1e-9)
    assert r.busbw_gbps == pytest.approx(nbytes / want / 1e9 * (p - 1) / p)
    sub = Ring().schedule(32, ranks=tuple(range(0, 32, 2)))  # 16 of 32 ranks
    assert sim.simulate(sub, nbytes=nbytes, network=FLAT).time_s == pytest.approx(
        sim.ring_time(16, nbytes, FLAT.inter)
    )


def test_simulate_rejects_bad_input():
    with pytest.raises(ValueError, match="world_size 4, not 8"):
        sim.simulate(Ring().schedule(4), 8, 1024, network=FLAT)
    with pytest.raises(ValueError, match="needs world_size"):
        sim.simulate("ring", None, 1024, network=FLAT)
    with pytest.raises(ValueError, match="multiple of itemsize"):
        sim.simulate("ring", 4, 1023, network=FLAT)
    with pytest.raises(ValueError, match="one time per rank"):
        sim.simulate("ring", 4, 1024, network=FLAT, start_s=[0.0, 1.0])
    with pytest.raises(TypeError, match="Network"):
        sim.simulate("ring", 4, 1024, network="h100")
    with pytest.raises(ValueError, match="unknown algorithm"):
        sim.simulate("rnig", 4, 1024, network=FLAT)


def test_network_validation():
    with pytest.raises(ValueError, match="alpha_s"):
        sim.Link(-1e-6, 1e-9)
    with pytest.raises(ValueError, match="beta_s_per_byte"):
        sim.Link(1e-6, 0)
    with pytest.raises(TypeError, match="number"):
        sim.Link("1", 1e-9)
    with pytest.raises(ValueError, match="gbytes_per_s"):
        sim.Link.from_bandwidth(1, 0)
    link = sim.Link(1e-6, 1e-9)
    with pytest.raises(ValueError, match="ranks_per_node"):
        sim.Network(link, link, ranks_per_node=0)
    with pytest.raises(ValueError, match="nics_per_node"):
        sim.Network(link, link, nics_per_node=True)
    with pytest.raises(TypeError, match="intra must be a Link"):
        sim.Network(1e-6, link)
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.ranks_per_node = 4
    with pytest.raises(ValueError, match="network file"):
        sim.Network.from_dict({"alpha": 1})


def test_network_presets_and_round_trip(tmp_path):
    assert H100.intra.bandwidth_gbps == pytest.approx(
        370
    ) and H100.inter.bandwidth_gbps == pytest.approx(48)
    assert (H100.ranks_per_node, H100.nics_per_node) == (8, 8)
    assert H100.single_class(8) is H100.intra and H100.single_class(16) is None
    probed = sim.Network.from_probe(50e-6, 1e-9)
    assert probed.single_class(4096) == sim.Link(50e-6, 1e-9)
    path = tmp_path / "net.json"
    path.write_text(__import__("json").dumps(H100.to_dict()))
    assert sim.Network.load(path) == H100
    assert sim.Network.from_dict({"alpha_s": 50e-6, "beta_s_per_byte": 1e-9}) == probed


def test_estimate_is_the_closed_form_on_one_class_and_the_simulation_otherwise():
    assert sim.estimate("ring", 64, 1 << 20, FLAT) == sim.ring_time(64, 1 << 20, FLAT.inter)
    assert (
        sim.estimate("ring", 64, 1 << 20, H100)
        == sim.simulate("ring", 64, 1 << 20, network=H100).time_s
    )


def test_price_all_skips_only_candidates_that_cannot_win():
    algs = [Ring(), HalvingDoubling(), Torus2D(8, 8), Torus2D(2, 32)]
    exact = [sim.simulate(a, 64, 1 << 16, network=H100).time_s for a in algs]
    priced = sim.price_all(algs, 64, 1 << 16, H100)
    assert min(t for t in priced if t is not None) == min(exact)
    assert any(t is None for t in priced)  # the ring cannot win at 64 KiB
    for t, e in zip(priced, exact):
        assert t is None or t == e


# ----------------------------------------------------------------------------- stragglers
def test_delays_are_seeded_and_shaped():
    a = sim.arrivals(16, 0.1, sim.Exponential(1e-3), 50, seed=3)
    assert a.shape == (50, 16) and np.array_equal(
        a, sim.arrivals(16, 0.1, sim.Exponential(1e-3), 50, seed=3)
    )
    assert not np.array_equal(a, sim.arrivals(16, 0.1, sim.Exponential(1e-3), 50, seed=4))
    assert (a >= 0.1).all()
    assert np.array_equal(sim.arrivals(4, 0.2, None, 3), np.full((3, 4), 0.2))
    for d in (sim.LogNormal(1e-3, 0.5), sim.Pareto(1e-3, 3.0)):
        draws = d.sample(np.random.default_rng(0), 200_000)
        assert draws.mean() == pytest.approx(d.mean_s, rel=0.05)
    with pytest.raises(ValueError):
        sim.Exponential(-1.0)
    with pytest.raises(ValueError):
        sim.Pareto(1e-3, 0.0)


def test_synchronous_step_waits_for_the_slowest_rank():
    p, nbytes, compute = 64, 1 << 20, 0.05
    coll = sim.simulate("ring", p, nbytes, network=FLAT).time_s
    calm = sim.simulate_steps("ring", p, nbytes, FLAT, compute_s=compute, samples=10)
    assert np.allclose(calm.step_s, compute + coll) and calm.slowdown == pytest.approx(1.0)
    mean = 1e-3
    expo = sim.simulate_steps(
        "ring",
        p,
        nbytes,
        FLAT,
        compute_s=compute,
        delay=sim.Exponential(mean),
        samples=4000,
        seed=1,
    )
    harmonic = sum(1 / k for k in range(1, p + 1))  # E[max of p exponentials] = mean * H_p
    assert expo.mean_s - compute - coll == pytest.approx(mean * harmonic, rel=0.05)
    again = sim.simulate_steps(
        "ring",
        p,
        nbytes,
        FLAT,
        compute_s=compute,
        delay=sim.Exponential(mean),
        samples=4000,
        seed=1,
    )
    assert np.array_equal(expo.step_s, again.step_s)
    # same mean delay, heavier tail: worse p99 and worse mean at scale
    pareto = sim.simulate_steps(
        "ring",
        p,
        nbytes,
        FLAT,
        compute_s=compute,
        delay=sim.Pareto(mean, 2.0),
        samples=4000,
        seed=1,
    )
    assert pareto.p99_s > expo.p99_s and pareto.mean_s > expo.mean_s
    # more ranks, more waiting
    small = sim.simulate_steps(
        "ring",
        4,
        nbytes,
        FLAT,
        compute_s=compute,
        delay=sim.Exponential(mean),
        samples=4000,
        seed=1,
    )
    assert small.wait_s.mean() < expo.wait_s.mean()
    # overlap hides that fraction of the collective
    hidden = sim.simulate_steps("ring", p, nbytes, FLAT, compute_s=compute, overlap=1.0, samples=5)
    assert np.allclose(hidden.step_s, compute)
    assert "exponential" in str(expo)


def test_delays_from_their_mean():
    assert sim.Exponential.from_mean(2e-3) == sim.Exponential(2e-3)
    assert sim.Pareto.from_mean(2e-3) == sim.Pareto(2e-3, 2.0)
    assert sim.Pareto.from_mean(2e-3, 3.0) == sim.Pareto(4e-3, 3.0)
    assert sim.LogNormal.from_mean(2e-3, 0.5).median_s == 2e-3 / float(np.exp(0.125))
    for d in (
        sim.Exponential.from_mean(1e-3),
        sim.LogNormal.from_mean(1e-3),
        sim.Pareto.from_mean(1e-3, 4.0),
    ):
        assert d.mean_s == pytest.approx(1e-3, rel=1e-12)
    bad = [
        (sim.Exponential.from_mean, (-1.0,), "non-negative"),
        (sim.Exponential.from_mean, (math.inf,), "finite"),
        (sim.LogNormal.from_mean, (1e-3, 0.0), "sigma must be positive"),
        (sim.LogNormal.from_mean, (1e-3, math.nan), "sigma"),
        (sim.Pareto.from_mean, (1e-3, 1.0), "above 1 for a finite mean"),
        (sim.Pareto.from_mean, (math.nan,), "finite"),
    ]
    for make, args, why in bad:
        with pytest.raises(ValueError, match=why):
            make(*args)


def test_backup_steps_start_at_the_nth_arrival():
    p, coll, kw = 16, 1e-3, dict(compute_s=0.05, delay=sim.Exponential(1e-3), samples=200, seed=3)
    arrive = sim.arrivals(p, 0.05, sim.Exponential(1e-3), 200, 3)
    sync, one, two = sim.simulate_backup(p, coll, (0, 1, 2), **kw)
    assert np.array_equal(sync.step_s, sim.synchronous_start(arrive) + coll)
    assert np.array_equal(two.step_s, sim.first_n_start(arrive, p - 2) + coll)
    assert (sync.backups, one.backups, two.backups) == (0, 1, 2)
    assert sync.mean_s > one.mean_s > two.mean_s and sync.p99_s >= one.p99_s
    # the same draws as a synchronous simulate_steps of a collective that takes as long
    steps = sim.simulate_steps("ring", p, 1 << 20, FLAT, **kw)
    (again,) = sim.simulate_backup(p, steps.collective_s, **kw)
    assert np.array_equal(again.step_s, steps.step_s)


def test_dataflow_replay_lets_early_ranks_start_but_still_waits_for_the_slowest():
    p, nbytes = 16, 1 << 20
    kw = dict(compute_s=0.01, delay=sim.LogNormal(1e-3, 1.0), samples=64, seed=7)
    barrier = sim.simulate_steps("torus2d", p, nbytes, FLAT, **kw)
    flow = sim.simulate_steps("torus2d", p, nbytes, FLAT, dataflow=True, **kw)
    arrive = sim.arrivals(p, 0.01, sim.LogNormal(1e-3, 1.0), 64, seed=7).max(axis=1)
    assert (flow.step_s <= barrier.step_s + 1e-12).all()
    assert (flow.step_s > arrive).all()
    # one sample by hand: simulate() with per-rank start times gives the same end
    starts = sim.arrivals(p, 0.01, sim.LogNormal(1e-3, 1.0), 64, seed=7)[5]
    one = sim.simulate("torus2d", p, nbytes, network=FLAT, start_s=starts)
    assert one.start_s + one.time_s == pytest.approx(flow.step_s[5], rel=1e-12)


def test_a_late_rank_delays_the_ring_by_at_most_its_lateness():
    p, nbytes, late = 8, 1 << 20, 1e-3
    base = sim.simulate("ring", p, nbytes, network=FLAT).time_s
    start = np.zeros(p)
    start[3] = late
    r = sim.simulate("ring", p, nbytes, network=FLAT, start_s=start)
    assert base < r.time_s <= base + late + 1e-12


# ----------------------------------------------------------------------------- CLI
def test_simulate_cli_prints_tables_and_writes_three_plots(tmp_path):
    import argparse

    from commrt.cli import simulate as sim_cli

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    sim_cli.register(sub)
    args = parser.parse_args(
        [
            "simulate",
            "--max-p",
            "32",
            "--at-p",
            "16",
            "--sizes",
            "64K,64M",
            "--samples",
            "50",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert args.single_process and args.run is sim_cli.cmd_simulate
    lines = []
    report = sim_cli.run(args, out=lines.append)
    text = "\n".join(lines)
    assert "time per all-reduce vs p · 64 KiB" in text and "time vs message size at p=16" in text
    assert "synchronous step" in text and "latency-bound below" in text
    assert sorted(os.path.basename(f) for f in report["files"]) == sorted(sim_cli.FILES.values())
    for f in report["files"]:
        assert os.path.getsize(f) > 10_000 and f"wrote {f}" in text
    # the 64 MiB column at p=16 (2 nodes of 8): the torus with one row per node wins,
    # pipelined so that the NVLink rows overlap the IB columns
    assert report["vs_p"][64 << 20]["auto"][3][1] == "torus2d_pipelined(2x8,s16,ring)"
    with pytest.raises(SystemExit):
        sim_cli.network_from_args(
            argparse.Namespace(network="nonsense", ranks_per_node=None, nics_per_node=None)
        )
