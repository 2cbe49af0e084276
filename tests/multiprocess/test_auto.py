"""algorithm="auto": choices from the cost model, the probe, and one mpiexec run against MPI."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
from helpers.mp import mpiexec

from commrt import sim
from commrt.algorithms import Auto, HalvingDoubling, RecursiveDoubling, Ring, Torus2D, resolve
from commrt.algorithms.auto import candidates, choices
from commrt.runtime.slots import CommSlots
from commrt.tuning.memory import AutoMemory
from commrt.tuning.probe import _fit

FLAT = sim.Network.flat(alpha_s=20e-6, beta_s_per_byte=1 / 5e9)
SMALL, LARGE = 1 << 10, 256 << 20


def _first_job(labels):
    """No earlier job's verdicts (commrt.tuning.memory): a first job's."""
    return AutoMemory({}, None, writes=False)


def _fake_comm(p):
    return SimpleNamespace(world_size=p, slots=CommSlots(), fuses_one_shot=False, memory=_first_job)


def test_candidates_are_ring_hd_rd_and_every_real_torus_grid():
    assert [str(a) for a in candidates(12)] == [
        "ring",
        "halving_doubling",
        "recursive_doubling",
        "torus2d(2×6)",
        "torus2d(3×4)",
        "torus2d(4×3)",
        "torus2d(6×2)",
    ] + [f"torus2d_pipelined({g},s{s},ring)" for g in ("2x6", "3x4", "4x3", "6x2") for s in (4, 16)]
    assert not any("pipelined" in str(a) for a in candidates(72))  # too costly to price there
    # a prime has no 2D grid
    assert candidates(7) == [Ring(), HalvingDoubling(), RecursiveDoubling()]
    assert resolve("auto") == Auto()


def test_small_messages_pick_latency_optimal_and_large_bandwidth_optimal():
    auto = Auto(network=FLAT)
    # p = 12: recursive doubling has the fewest steps (5, with fold-in/out), HD 8; the most
    # square torus moves the ring's 1.83n in 10 steps; the ring needs 22 steps.
    assert auto.choose(12, SMALL).label == "recursive_doubling"
    big = auto.choose(12, LARGE)
    assert big.label == "torus2d(3x4)" and big.algorithm == Torus2D(3, 4)
    assert big.predicted_s == pytest.approx(sim.torus_time(3, 4, LARGE, FLAT.inter))
    # a prime: no torus; the ring wins big messages
    assert auto.choose(7, SMALL).label == "recursive_doubling"
    assert auto.choose(7, LARGE).label == "ring"
    # p a power of two: RD's 6 steps win latency-bound sizes; for large ones HD has the
    # ring's bytes in 12 steps (RD sends 6n)
    assert auto.choose(64, SMALL).label == "recursive_doubling"
    assert auto.choose(64, LARGE).label == "halving_doubling"
    # candidates come back cheapest first
    times = [t for _, t in big.candidates]
    assert times == sorted(times) and big.candidates[0] == ("torus2d(3x4)", big.predicted_s)


def test_with_nodes_the_torus_takes_one_row_per_node_for_large_messages():
    auto = Auto(network=sim.Network.h100_nvlink_ib())
    assert auto.choose(64, 64 << 10).label == "recursive_doubling"
    big = auto.choose(64, LARGE)
    # rows of 8 = one node: NVLink rows, IB columns (pipelined: the rows overlap the columns)
    assert big.label in ("torus2d(8x8)", "torus2d_pipelined(8x8,s16,ring)")
    assert big.predicted_s == pytest.approx(
        sim.simulate(big.algorithm, 64, LARGE, network=auto.network).time_s
    )


def test_choices_are_cached_on_the_communicator_and_name_the_schedule():
    comm = _fake_comm(12)
    auto = Auto(network=FLAT)
    s1 = auto.select(12, LARGE, comm)
    s2 = Auto(network=FLAT).select(12, LARGE, comm)
    assert s1 is s2  # same object: the executor's plan cache hits
    assert s1.name == "auto:torus2d(3x4)" and s1.check().ok
    auto.select(12, SMALL, comm)
    made = choices(comm)
    assert {n: c.label for n, c in made.items()} == {
        LARGE: "torus2d(3x4)",
        SMALL: "recursive_doubling",
    }
    assert "torus2d(3x4)" in str(made[LARGE])


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_recursive_doubling_wins_where_latency_dominates(p):
    # this machine's order of magnitude (tests/probe): α 10 µs, 4 GB/s, adds at 8 GB/s
    net = dataclasses.replace(
        sim.Network.flat(alpha_s=10e-6, beta_s_per_byte=1 / 4e9), gamma_s_per_byte=1 / 8e9
    )
    auto = Auto(network=net)
    for n in (8, 4 << 10):
        c = auto.choose(p, n)
        assert c.label == "recursive_doubling", c
        # its predicted time is its closed form: log2(q) (+2 folded) full-buffer steps
        want = sim.recursive_doubling_time(p, n, net.inter, net.gamma_s_per_byte)
        assert c.predicted_s == pytest.approx(want)
    # large buffers: RD sends log2(q)·n and adds as much; the bandwidth-optimal schedules win,
    # even at p = 2, where RD's one step moves the ring's bytes but adds twice what the ring adds
    assert auto.choose(p, 32 << 20).label in ("ring", "halving_doubling")
    # with no per-message latency nothing favours few steps: RD never wins
    free = dataclasses.replace(net, intra=sim.Link(0.0, 1 / 4e9), inter=sim.Link(0.0, 1 / 4e9))
    assert Auto(network=free).choose(p, 8).label != "recursive_doubling"


def test_recursive_doubling_crossover_follows_alpha_over_gamma():
    # p = 2: RD = α + n(β+γ), ring = 2α + nβ + nγ/2, so RD wins below n = 2α/γ
    link = sim.Link(10e-6, 1 / 4e9)
    gamma = 1 / 8e9
    net = sim.Network(link, link, gamma_s_per_byte=gamma)
    cross = 2 * link.alpha_s / gamma
    assert Auto(network=net).choose(2, int(cross * 0.9) // 4 * 4).label == "recursive_doubling"
    assert Auto(network=net).choose(2, int(cross * 1.1) // 4 * 4).label == "ring"


def test_schedule_without_a_size_needs_a_network():
    with pytest.raises(ValueError, match="no buffer size"):
        Auto().schedule(8)
    with pytest.raises(ValueError, match="needs a network"):
        Auto().select(8, 1024)
    s = Auto(network=FLAT).schedule(12)  # picks for a 25 MiB bucket
    assert s.name == "auto:torus2d(3x4)" and s.check().ok
    sub = Auto(network=FLAT).schedule(16, ranks=(0, 2, 4, 6, 8, 10))
    assert sub.ranks == (0, 2, 4, 6, 8, 10) and sub.check().ok
    with pytest.raises(TypeError, match="Network"):
        Auto(network="h100")


def test_simulate_auto_uses_the_simulated_network():
    r = sim.simulate("auto", 12, LARGE, network=FLAT)
    assert r.name == "auto:torus2d(3x4)"
    assert r.time_s == pytest.approx(sim.torus_time(3, 4, LARGE, FLAT.inter))


def test_probe_fit():
    alpha, beta = 50e-6, 1e-9
    sizes = (8, 1 << 20, 4 << 20)
    a, b = _fit(sizes, [alpha + s * beta for s in sizes])
    assert a == pytest.approx(alpha + 8 * beta) and b == pytest.approx(beta, rel=1e-6)
    a, b = _fit(sizes, [1e-3, 0.5e-3, 0.4e-3])  # nonsense timings still give a usable model
    assert a == 1e-3 and b > 0


@pytest.mark.mpi
def test_auto_all_reduce_matches_mpi_and_all_ranks_agree(tmp_path):
    out = tmp_path / "auto.json"
    mpiexec(4, "auto_worker.py", out)
    report = json.loads(out.read_text())
    ranks = report["ranks"]
    assert report["world_size"] == 4 and len(ranks) == 4
    assert [f for r in ranks for f in r["failures"]] == []
    # every rank: the same agreed probe, the same choices, probed once and cached
    assert all(r["probe"] == ranks[0]["probe"] for r in ranks)
    assert all(r["choices"] == ranks[0]["choices"] for r in ranks)
    assert all(r["probe_cached_once"] for r in ranks)
    # on one node no per-step overheads (commrt.tuning.probe_steps): α + β·n prices shared memory
    assert all(r["overhead"] == [None, None, None] for r in ranks)
    assert all(o == "None" for o in ranks[0]["priced_with"])
    # per run the slowest rank's time, then the median over runs: at least every rank's own
    alpha, _ = ranks[0]["probe"]
    assert alpha >= max(a for a, _ in ranks[0]["per_rank"])
    assert set(ranks[0]["choices"]) == {"4", "4000", "4000012"}
    for label, name, _, cands in ranks[0]["choices"].values():
        assert name == f"auto:{label}" and cands[0][0] == label
    # the choice names the trace spans
    assert ranks[0]["spans"] and all(s.startswith("commrt/auto:") for s in ranks[0]["spans"])


def test_tier_shifts_measure_each_link_class():
    from commrt.tuning.probe import _shift_schedule, _tier_schedules

    p, L = 8, 2
    tiers = _tier_schedules(p, L)
    intra, _ = tiers["intra"]
    assert all(intra[r] // L == r // L and intra[r] != r for r in range(p))  # stays on its node
    shared, _ = tiers["shared"]
    assert all(shared[r] // L == (r // L + 1) % (p // L) for r in range(p))  # all to the next node
    inter, lead = tiers["inter"]
    assert lead == (0, 2, 4, 6) and inter == {0: 2, 2: 4, 4: 6, 6: 0}  # one per node, alone
    s = _shift_schedule(p, 3, inter, lead)
    assert s.ranks == lead and s.num_steps == 3
    assert {(o.rank, o.peer) for o in s.steps[0].ops if o.kind.name == "SEND"} == set(inter.items())


def test_probe_network_with_two_tiers_and_nic_sharing():
    from commrt.tuning.probe import ProbeResult, _nics

    # two ranks behind one NIC take twice as long as one alone; behind two NICs, as long
    assert _nics(2, alone_s=8.5e-3, shared_s=16.9e-3, alpha_s=1e-4) == 1
    assert _nics(2, alone_s=8.5e-3, shared_s=8.7e-3, alpha_s=1e-4) == 2
    assert _nics(8, alone_s=1e-3, shared_s=2e-3, alpha_s=0.0) == 4
    r = ProbeResult(
        1e-4,
        1 / 1e9,
        (8, 1 << 20),
        (1e-4, 1e-3),
        ((1e-4, 1e-9),),
        "gloo",
        8,
        1.0,
        ranks_per_node=2,
        inter_alpha_s=5e-4,
        inter_beta_s_per_byte=8e-9,
        nics_per_node=1,
    )
    net = r.network()
    assert (net.ranks_per_node, net.nics_per_node) == (2, 1)
    assert net.intra == sim.Link(1e-4, 1e-9) and net.inter == sim.Link(5e-4, 8e-9)
    assert sim.Network.from_dict(r.to_dict()) == net  # a saved probe file loads as is
    assert "between nodes" in str(r)
    # on it, auto keeps the heavy bytes inside nodes for big buffers: one row per node
    assert Auto(network=net).choose(8, 16 << 20).label in (
        "torus2d(4x2)",
        "torus2d_pipelined(4x2,s4,ring)",
    )


def test_where_the_one_shot_is_the_runner_up_auto_tries_it():
    """On a transport that runs the one-shot whole, the model may rank it second (here
    at 6 MiB on 4 ranks, after recursive doubling): the trial takes it as the runner-up.
    Its lookup once ignored the one-shot and raised StopIteration in the first call."""
    net = sim.Network.flat(alpha_s=300e-6, beta_s_per_byte=1 / 20e9)
    comm = SimpleNamespace(
        world_size=4, rank=0, slots=CommSlots(), fuses_one_shot=True, memory=_first_job
    )
    auto = Auto(network=net)
    choice = auto.choose(4, 6 << 20, comm)
    assert [name for name, _ in choice.candidates[:2]] == ["recursive_doubling", "one_shot"]
    assert auto.select(4, 6 << 20, comm).name.startswith("auto:")
    (tuning,) = [t for (_, p, n), t in comm.slots.auto_tuning.items() if n == 6 << 20]
    assert "one_shot" in (tuning.live or tuning.rotation), tuning
