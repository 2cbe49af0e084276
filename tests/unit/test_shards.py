"""Reduce-scatter and all-gather as first-class schedules: checked, priced, run.

The multi-process runs (against gloo) are in tests/workers/td_collectives_worker.py
(test_torch_backend.py); here the schedules themselves.
"""

import pytest
import torch

import commrt
from commrt.algorithms import HalvingDoubling, Ring, Torus2D
from commrt.collectives.shards import shard_schedule
from commrt.schedule import Collective
from commrt.sim import simulate

KINDS = (Collective.REDUCE_SCATTER, Collective.ALL_GATHER)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8, 16, 64])
def test_shard_schedules_pass_the_symbolic_checker(kind, p):
    algs = [Ring(), Torus2D()] + ([HalvingDoubling()] if p & (p - 1) == 0 else [])
    for alg in algs:
        s = shard_schedule(alg, p, kind)
        assert s.collective is kind and s.check().ok, (alg.name, p, s.check())
        assert sorted(s.owners) == list(range(p))  # one chunk per rank


def test_halving_doubling_shards_need_a_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        HalvingDoubling().schedule(6, collective=Collective.REDUCE_SCATTER)
    with pytest.raises(ValueError, match="has no reduce_scatter schedule"):
        shard_schedule(commrt.algorithms.RecursiveDoubling(), 4, Collective.REDUCE_SCATTER)


def test_the_simulator_prices_shard_schedules():
    n = 64 << 20
    for alg in (Ring(), HalvingDoubling(), Torus2D()):
        rs = simulate(shard_schedule(alg, 16, Collective.REDUCE_SCATTER), nbytes=n)
        ag = simulate(shard_schedule(alg, 16, Collective.ALL_GATHER), nbytes=n)
        ar = simulate(alg.schedule(16), nbytes=n)
        # reduce-scatter + all-gather is an all-reduce: each half costs about half of it
        assert 0.3 * ar.time_s < rs.time_s < 0.7 * ar.time_s, alg.name
        assert 0.3 * ar.time_s < ag.time_s < 0.7 * ar.time_s, alg.name
    assert (
        simulate(
            shard_schedule(HalvingDoubling(), 16, Collective.ALL_GATHER), nbytes=1024
        ).num_steps
        < simulate(shard_schedule(Ring(), 16, Collective.ALL_GATHER), nbytes=1024).num_steps
    )


def test_single_rank_shards_copy(tmp_path):
    with commrt.init("gloo", rank=0, world_size=1) as comm:
        out = commrt.reduce_scatter(torch.empty(4), torch.arange(4.0), comm, op="avg")
        assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
        got = commrt.all_gather(
            torch.empty(3, dtype=torch.uint8), torch.ones(3, dtype=torch.uint8), comm
        )
        assert got.tolist() == [1, 1, 1]
        with pytest.raises(ValueError, match="must hold world_size"):
            commrt.reduce_scatter(torch.empty(3), torch.arange(4.0), comm)
