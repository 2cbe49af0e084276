"""GossipGraD without processes: the peer function, its schedules and the checker,
the mixing math, and GradientSync / GossipShuffle / average_parameters on
in-process ranks (threads over tests/helpers/local_transport.py). The same runtime
paths on real MPI and gloo ranks are in test_gossip_mp.py."""

import dataclasses
import hashlib
import threading

import numpy as np
import pytest
import torch
from helpers.gossip import gossip_model, gossip_steps, run_shuffle, shard
from helpers.local_transport import LocalTransport, Mailbox

import commrt
from commrt.algorithms import Gossip, resolve
from commrt.errors import ScheduleError
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.schedule import Collective, Op, OpKind, Step

TOPOLOGIES = ["hypercube", "dissemination"]
# disagreement ‖x − x̄‖ shrinks per period of ⌈log2 p⌉ dissemination steps by at least this factor
# (computed exactly below: 1/4 at p=3, 0.2023 at p=5, √3/8 = 0.2165 at p=6)
DISSEMINATION_RATE = 0.25


def sizes(topology, hi=64):
    return [p for p in range(1, hi + 1) if topology == "dissemination" or p & (p - 1) == 0]


# ------------------------------------------------------------------------------ peers
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_peers_are_pure_consistent_and_never_self(topology):
    for rotate in (True, False):
        g = Gossip(topology, rotate=rotate, seed=5)
        for p in sizes(topology, 33):
            for t in range(3 * g.period_length(p) + 1):
                send, recv = g.peer_arrays(t, p)
                assert sorted(send.tolist()) == list(range(p))  # a permutation
                assert all(recv[send[r]] == r for r in range(p))  # my target receives from me
                if p > 1:
                    assert all(send != np.arange(p)) and all(recv != np.arange(p))
                if topology == "hypercube":
                    assert np.array_equal(send, recv)
                # pure: a fresh instance (another rank's) says the same, per rank
                fresh = Gossip(topology, rotate=rotate, seed=5)
                assert [fresh.peers(r, t, p) for r in range(p)] == list(
                    zip(send.tolist(), recv.tolist())
                )
    assert Gossip(topology).peers(0, 7, 1) == (0, 0)  # p = 1: nobody to talk to


def test_fixed_cube_and_dissemination_follow_the_paper():
    cube = Gossip("hypercube", rotate=False)
    assert [cube.peers(5, t, 8) for t in range(4)] == [(4, 4), (7, 7), (1, 1), (4, 4)]
    dis = Gossip("dissemination", rotate=False)
    assert [dis.peers(0, t, 6) for t in range(4)] == [(1, 5), (2, 4), (4, 2), (1, 5)]
    # rotation: same partner rule on virtual ranks perm[rank], a new perm every log2 p steps
    rot = Gossip("hypercube", seed=1)
    for period in range(4):
        virt = np.random.default_rng([1, period]).permutation(16)
        real = np.argsort(virt)
        for k in range(4):
            assert rot.peers(3, period * 4 + k, 16)[0] == real[virt[3] ^ (1 << k)]
    assert (
        Gossip(seed=1).peer_arrays(9, 16)[0].tolist()
        != Gossip(seed=2).peer_arrays(9, 16)[0].tolist()
    )


def test_bad_options_and_hypercube_on_six_ranks_raise():
    with pytest.raises(ValueError, match="topology"):
        Gossip("ring")
    with pytest.raises(ValueError, match="seed"):
        Gossip(seed=-1)
    with pytest.raises(ValueError, match="asynchronous"):
        Gossip(asynchronous="yes")
    for call in (lambda: Gossip().peers(0, 0, 6), lambda: Gossip().schedule(6)):
        with pytest.raises(ValueError, match="power-of-two number of ranks, got 6.*dissemination"):
            call()
    assert resolve("gossip") == Gossip()
    with pytest.raises(ValueError, match="not an all-reduce"):
        Gossip().select(4, 1024)


# -------------------------------------------------------------------------- schedules
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_schedules_are_checked_for_p_1_to_64_and_several_steps(topology):
    for rotate in (True, False):
        g = Gossip(topology, rotate=rotate, seed=3)
        for p in sizes(topology):
            for t in range(2 * g.period_length(p) + 1):
                s = g.schedule(p, step=t)
                report = s.check()
                assert report.ok, str(report)
                assert s.collective is Collective.GOSSIP and s.num_steps == (1 if p > 1 else 0)
                assert s.messages() == (p if p > 1 else 0)  # one message per rank
                assert s.sources == tuple(g.peer_arrays(t, p)[1].tolist())


def test_checker_knows_what_gossip_means():
    g = Gossip(rotate=False)
    s = g.schedule(4, step=0)  # 0↔1, 2↔3
    # claims a different peer than the ops deliver
    wrong = dataclasses.replace(s, sources=(2, 0, 3, 2))
    assert "rank 0, chunk 0: ends with contributions of ranks {0,1}" in str(wrong.check())
    # a rank that adds two peers' contributions has too many
    ops = list(s.steps[0].ops) + [Op(OpKind.SEND, 2, 0, 0, 1), Op(OpKind.RECV_REDUCE, 0, 2, 0, 1)]
    extra = dataclasses.replace(s, steps=(Step.of(ops),))
    assert "rank 0, chunk 0: ends with contributions of ranks {0,1,2}" in str(extra.check())
    # a copy instead of an add loses the rank's own contribution
    ops = [
        Op(
            OpKind.RECV_COPY if o.kind is OpKind.RECV_REDUCE and o.rank == 3 else o.kind,
            o.rank,
            o.peer,
            0,
            1,
        )
        for o in s.steps[0].ops
    ]
    assert "rank 3, chunk 0: ends with contributions of ranks {2} (missing {3})" in str(
        dataclasses.replace(s, steps=(Step.of(ops),)).check()
    )
    with pytest.raises(ScheduleError, match="one source rank"):
        dataclasses.replace(s, sources=None)


# --------------------------------------------------------------------- mixing math
def mix(x: np.ndarray, g: Gossip, steps) -> np.ndarray:
    """Pure gossip of one vector per rank: x_r ← ½ x_r + ½ x_{recv_from(r)}."""
    for t in steps:
        _, recv = g.peer_arrays(t, len(x))
        x = 0.5 * x + 0.5 * x[recv]
    return x


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_hypercube_averages_exactly_in_log2p_steps_in_every_rotation_period(p):
    L = p.bit_length() - 1
    rng = np.random.default_rng(p)
    for rotate in (True, False):
        g = Gossip("hypercube", rotate=rotate, seed=11)
        for period in range(6):
            x = rng.standard_normal((p, 33))
            out = mix(x, g, range(period * L, (period + 1) * L))
            assert np.allclose(out, x.mean(axis=0), rtol=0, atol=1e-13), (rotate, period)
            # one step fewer is not yet an average
            assert not np.allclose(
                mix(x, g, range(period * L, (period + 1) * L - 1)), x.mean(axis=0)
            )


@pytest.mark.parametrize("p", [8, 16, 32])
def test_rotation_meets_more_partners_than_the_fixed_cube(p):
    L = p.bit_length() - 1
    periods = 4
    for rotate, check in ((False, lambda n: n == L), (True, lambda n: n > L)):
        g = Gossip("hypercube", rotate=rotate, seed=0)
        met = [set() for _ in range(p)]
        for t in range(periods * L):
            for r, q in enumerate(g.peer_arrays(t, p)[1].tolist()):
                met[r].add(q)
        assert all(check(len(m)) for m in met), (rotate, sorted(len(m) for m in met))


@pytest.mark.parametrize("p", [3, 5, 6])
def test_dissemination_disagreement_shrinks_geometrically(p):
    g = Gossip("dissemination", seed=4)
    L = g.period_length(p)
    center = np.eye(p) - 1.0 / p
    for period in range(20):
        m = np.eye(p)
        for t in range(period * L, (period + 1) * L):
            _, recv = g.peer_arrays(t, p)
            w = 0.5 * np.eye(p)
            w[np.arange(p), recv] += 0.5
            m = w @ m
        rate = np.linalg.norm(center @ m @ center, 2)  # worst case over all vectors, this period
        assert 0.1 < rate <= DISSEMINATION_RATE + 1e-12, (period, rate)
    x = np.random.default_rng(p).standard_normal((p, 7))
    spread0 = np.linalg.norm(x - x.mean(0))
    for k in range(1, 9):
        x = mix(x, g, range((k - 1) * L, k * L))
        spread = np.linalg.norm(x - x.mean(0))
        assert 0 < spread <= spread0 * DISSEMINATION_RATE**k * (1 + 1e-9), (
            k
        )  # geometric, never exact


# --------------------------------------------------------------- in-process ranks
def _comm(tr, timeout=20.0):
    return Communicator(
        tr, Backend.GLOO, LaunchInfo("none", tr.rank, tr.world_size, 0, None), timeout, 1 << 20
    )


def each_rank(p, fn):
    """``fn(comm)`` on p thread ranks; per rank its result or the exception it raised."""
    box, out = Mailbox(), [None] * p

    def body(r):
        try:
            out[r] = fn(_comm(LocalTransport(box, r, p)))
        except BaseException as e:  # returned, so that a test sees every rank's error
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


def ok(results):
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize(
    "p,alg",
    [
        (1, Gossip()),
        (2, Gossip()),
        (4, Gossip(asynchronous=True)),
        (3, Gossip("dissemination")),
        (5, Gossip("dissemination", asynchronous=True)),
    ],
    ids=str,
)
def test_gradient_sync_mixes_with_the_scheduled_peer(p, alg):
    for steps, nb, stats in ok(each_rank(p, lambda c: gossip_steps(c, alg))):
        assert nb >= 3
        assert [a for a, _ in steps] == ([0] + [1] * 5 if alg.asynchronous else [1] * 6)
        assert all(good for _, good in steps), steps
        assert stats.algorithms == (str(alg),) * nb
        extra = stats.last.extra
        assert extra["gossip_step"] == (4 if alg.asynchronous else 5)
        if (
            alg.asynchronous
        ):  # the policy's own copy of every bucket (plus the swap piece) is counted
            assert stats.buffer_bytes >= stats.grad_bytes


def test_gradient_sync_refuses_a_hypercube_on_six_ranks_on_every_rank():
    results = each_rank(6, lambda c: commrt.GradientSync(gossip_model(), c, algorithm=Gossip()))
    assert all(
        isinstance(r, ValueError) and "power-of-two number of ranks, got 6" in str(r)
        for r in results
    )


def test_average_parameters_is_exact_and_reports_the_disagreement():
    p = 4

    def body(comm):
        m = gossip_model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        with torch.no_grad():
            for i, q in enumerate(m.parameters()):
                q.add_(0.01 * (comm.rank + 1) * (i + 1))
        sum(q.square().sum() for q in m.parameters()).backward()
        opt.step()  # momentum buffers differ per rank
        mine = [q.detach().double().clone() for q in m.parameters()]
        moms = [opt.state[q]["momentum_buffer"].double().clone() for q in m.parameters()]
        with commrt.GradientSync(m, comm, broadcast_init=False) as sync:
            d = commrt.average_parameters(m, comm, opt)
            recorded = sync.stats.disagreement
        return (
            mine,
            moms,
            d,
            recorded,
            [q.detach().clone() for q in m.parameters()],
            [opt.state[q]["momentum_buffer"].clone() for q in m.parameters()],
        )

    res = ok(each_rank(p, body))
    mean = [sum(r[0][i] for r in res) / p for i in range(len(res[0][0]))]
    mom = [sum(r[1][i] for r in res) / p for i in range(len(res[0][1]))]
    norm = torch.cat([x.flatten() for x in mean]).norm()
    want = max(
        torch.cat([(a - b).flatten() for a, b in zip(r[0], mean)]).norm() / norm for r in res
    ).item()
    for r in res:
        assert r[2] == pytest.approx(want, rel=1e-9) and r[2] > 0 and r[3] == r[2]
        for got, exp in zip(r[4], mean):
            assert torch.equal(got, exp.to(got.dtype))  # the float64 mean, rounded once
        for got, exp in zip(r[5], mom):
            assert torch.equal(got, exp.to(got.dtype))
    assert len({r[2] for r in res}) == 1  # the same value on every rank
    # now they agree: a second call measures 0
    assert ok(each_rank(1, lambda c: commrt.average_parameters(gossip_model(), c))) == [0.0]


def test_average_parameters_refuses_different_models_on_every_rank():
    def body(comm):
        m = gossip_model() if comm.rank else torch.nn.Linear(3, 3)
        return commrt.average_parameters(m, comm)

    results = each_rank(3, body)
    assert all(isinstance(r, ValueError) and "different models" in str(r) for r in results)


def sample_hash(tables) -> str:
    """Order-free hash of all samples (rows) of all ranks' tables."""
    return hashlib.sha256(
        b"".join(sorted(row.numpy().tobytes() for t in tables for row in t))
    ).hexdigest()


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_shuffle_keeps_every_sample_changes_every_shard_and_overlap_changes_nothing(p):
    over = ok(each_rank(p, run_shuffle))
    forced = ok(each_rank(p, lambda c: run_shuffle(c, overlap=False)))
    before = sample_hash(
        [torch.cat([x, y.double()[:, None]], 1) for x, y in (shard(r) for r in range(p))]
    )
    after = sample_hash([torch.cat([x, y.double()[:, None]], 1) for _, x, y, _ in over])
    assert before == after
    assert sorted(i for _, _, y, _ in over for i in y.tolist()) == sorted(
        i for s, _, _, _ in over for i in s
    )
    for start, _x, y, _ in over:
        assert len(y) == 24 and set(y.tolist()) != start  # size kept, content changed
    for a, b in zip(over, forced):
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) and a[3] == b[3]


def test_shuffle_bad_input_raises_on_every_rank():
    def frac(comm):
        return commrt.data.GossipShuffle(
            shard(comm.rank), comm, fraction=1.5 if comm.rank == 1 else 0.5
        )

    def lengths(comm):
        return commrt.data.GossipShuffle(shard(comm.rank, n=24 + (comm.rank == 2)), comm)

    def cube6(comm):
        return commrt.data.GossipShuffle(shard(comm.rank), comm, gossip=Gossip("hypercube"))

    for p, fn, msg in (
        (3, frac, "bad input on rank(s) [1]"),
        (3, lengths, "shards of different lengths"),
        (6, cube6, "bad input on rank(s) [0, 1, 2, 3, 4, 5]"),
    ):
        results = each_rank(p, fn)
        assert all(isinstance(r, ValueError) and msg in str(r) for r in results), results
    assert "fraction must be a number in [0, 1], got 1.5" in str(each_rank(3, frac)[1])
    assert "rank 2: 25" in str(each_rank(3, lengths)[0])


# ---------------------------------------------------------------------- simulator
def test_simulated_gossip_step_is_one_message_whatever_p():
    from commrt import sim

    flat = sim.Network.flat(10e-6, 1 / 20e9)
    n = 1 << 20
    for p in (2, 8, 64, 512):
        r = sim.simulate_gossip(Gossip(), p, n, flat)
        assert np.allclose(r.step_s, flat.inter.time(n), rtol=1e-12)  # α + nβ every step
        assert r.mean_s < sim.ring_time(p, n, flat.inter) or p == 2
    h100 = sim.Network.h100_nvlink_ib()
    fixed = sim.simulate_gossip(Gossip(rotate=False), 64, n, h100)  # 8 nodes of 8
    want = [h100.intra.time(n)] * 3 + [h100.inter.time(n)] * 3  # cube dims 0-2 stay on a node
    assert (
        np.allclose(fixed.step_s, want * 2, rtol=1e-12)
        and fixed.off_node.tolist() == [0, 0, 0, 1, 1, 1] * 2
    )
    rotated = sim.simulate_gossip(Gossip(), 64, n, h100)
    assert rotated.off_node_share > fixed.off_node_share  # rotation sends partners off-node
    assert sim.simulate_gossip(Gossip(), 1, n).mean_s == 0.0
