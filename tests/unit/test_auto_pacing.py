"""How ``auto`` paces its first phases (:mod:`commrt.algorithms.auto_cost`), on ranks that
are threads: from the probe's α before anything is measured, and with every phase's gather
measured together with the decision after it."""

import time

import pytest
import torch
from helpers.local_transport import run_ranks

import commrt
from commrt.algorithms import Auto
from commrt.algorithms.auto import candidates
from commrt.algorithms.auto_cost import GATHER_ALPHAS, LEARN_CALL_ALPHAS
from commrt.algorithms.auto_learn import Tuning, calls_to_settle
from commrt.algorithms.auto_trial import MAX_HOLD
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.sim import Network
from commrt.tuning.probe import ProbeResult


def _comm(tr):
    info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
    return Communicator(tr, Backend.GLOO, info, 10.0, 1 << 20)


def test_a_first_jobs_first_hold_is_priced_from_the_probes_alpha(tmp_path, monkeypatch):
    # α = 40 µs (4 ranks on 2 cores over shm): a phase and its gather cost about 25 α there,
    # so 8 B calls of about α hold for as long as a hold may before the first is timed
    alpha = 40e-6
    saved = ProbeResult(
        alpha, 1e-9, (8, 1 << 20), (alpha, 1e-3), ((alpha, 1e-9),) * 2, "gloo", 2, 0.1
    )
    monkeypatch.setenv("COMMRT_CALIBRATION", saved.save(tmp_path / "probe.json"))

    def body(tr):
        comm = _comm(tr)
        commrt.all_reduce(torch.ones(2), comm, algorithm=Auto(), op="sum")
        (tuning,) = comm.slots.auto_tuning.values()
        return tuning

    for tuning in run_ranks(2, body):
        assert tuning.cost.call_s == pytest.approx(LEARN_CALL_ALPHAS * alpha)
        assert tuning.cost.gather_s == pytest.approx(GATHER_ALPHAS * alpha)
        assert tuning.phase == "hold" and tuning.held == MAX_HOLD


def test_a_phases_gather_is_measured_with_the_decision_after_it(monkeypatch):
    # what a phase's end costs the calls is the gather and the deciding both
    decide = Tuning.advance

    def slow_advance(self, table, costs=None):
        time.sleep(0.03)
        return decide(self, table, costs)

    monkeypatch.setattr(Tuning, "advance", slow_advance)
    slow_net = Network.flat(alpha_s=5e-3, beta_s_per_byte=1e-6)  # no hold: phases at once

    def body(tr):
        comm = _comm(tr)
        auto, x = Auto(network=slow_net), torch.zeros(2)
        for _ in range(calls_to_settle(len(candidates(2)))):
            commrt.all_reduce(x, comm, algorithm=auto, op="sum")
            (tuning,) = comm.slots.auto_tuning.values()
            if tuning.cost.gathers_s:  # a phase's row carried the gather before it
                break
        return tuning.cost.gathers_s

    for gathers in run_ranks(2, body):
        assert gathers and min(gathers) >= 0.03
