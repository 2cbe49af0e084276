"""The probe's timed runs (``commrt.tuning.probe_steps.time_runs``) on an in-process
transport: they time the steps a caller's repeated calls run."""

import torch
from helpers.local_transport import run_ranks

from commrt.tuning.probe import _shift_schedule
from commrt.tuning.probe_steps import time_runs


def _local_comm(tr):
    from commrt.process.environment import LaunchInfo
    from commrt.runtime.choice import Backend
    from commrt.runtime.communicator import Communicator

    return Communicator(
        tr, Backend.GLOO, LaunchInfo("none", tr.rank, tr.world_size, 0, None), 10.0, 1 << 20
    )


def test_timed_runs_reuse_one_kept_binding_as_a_callers_repeated_calls_do():
    # α is what a settled call's step costs: bound afresh each run, the probe timed the
    # binding too (an 8 B step over shm, 2 ranks: 70 µs, where a kept binding's took 6)
    def body(tr):
        comm = _local_comm(tr)
        sched = _shift_schedule(tr.world_size, 3, None, None)
        buf = torch.ones(8)
        times = time_runs(comm, sched, buf, repeats=4, calls=2)
        kept = comm.executor.bindings.cached()
        last = comm.executor.last
        return times, kept, last is not None and last.schedule is sched and last.bound in kept

    for times, kept, ran_kept in run_ranks(3, body):
        assert len(times) == 4 and all(t > 0 for t in times)
        assert len(kept) == 1  # one binding, made at the warm-up, kept for every run
        assert ran_kept  # the runs ran it
