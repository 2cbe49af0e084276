"""One-shot and two-shot all-reduce as schedules: the checker, the executor on an
in-process transport (against float64, the same bits on every rank where the schedule
promises it), the simulator, and their names."""

import pytest
import torch
from helpers.local_transport import run_ranks

from commrt import sim
from commrt.algorithms import OneShot, Ring, TwoShot, resolve
from commrt.schedule import Collective
from commrt.schedule.executor import Executor

FLAT = sim.Network.flat(alpha_s=5e-6, beta_s_per_byte=1 / 12.5e9)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 16])
def test_both_schedules_pass_the_symbolic_checker(p):
    one, two = OneShot().schedule(p), TwoShot().schedule(p)
    assert one.check().ok and two.check().ok
    # every rank meets every other once per phase: one step, or two
    assert (one.num_steps, two.num_steps) == ((1, 2) if p > 1 else (0, 0))
    assert one.messages() == p * (p - 1) and two.messages() == 2 * p * (p - 1)


def test_a_subset_of_ranks_and_other_collectives():
    s = TwoShot().schedule(6, ranks=(1, 3, 4))
    assert s.check().ok and s.ranks == (1, 3, 4)
    for alg in (OneShot(), TwoShot()):
        assert not alg.supports(Collective.REDUCE_SCATTER)
        with pytest.raises(ValueError, match="all_reduce only"):
            alg.schedule(4, collective=Collective.ALL_GATHER)


def _inputs(p, n):
    return [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(p)]


@pytest.mark.parametrize("alg", [OneShot(), TwoShot()], ids=str)
@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_executor_sums_within_rounding_of_float64(alg, p, dtype):
    xs = _inputs(p, 1001)
    want = torch.stack(xs).double().sum(0)
    sched = alg.schedule(p)

    def body(tr):
        buf = xs[tr.rank].to(dtype)
        Executor().run(sched, buf, tr, timeout=10, piece_bytes=512)
        return buf

    outs = run_ranks(p, body)
    tol = 1e-5 if dtype is torch.float32 else 2**-7 * p
    for out in outs:
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    if alg == TwoShot() or p == 2:  # each block summed once by its owner (or a + b = b + a)
        assert all(torch.equal(out, outs[0]) for out in outs)


def test_the_simulator_prices_them_by_replay():
    small, large = 64, 64 << 20
    one = sim.simulate(OneShot(), 8, small, network=FLAT).time_s
    two = sim.simulate(TwoShot(), 8, large, network=FLAT).time_s
    # one step's latency against the ring's 14; two-shot moves the ring's bytes
    assert one < sim.simulate(Ring(), 8, small, network=FLAT).time_s
    assert two == pytest.approx(sim.simulate(Ring(), 8, large, network=FLAT).time_s, rel=0.05)


def test_names_resolve():
    assert resolve("one_shot") == OneShot() and resolve("two-shot") == TwoShot()
