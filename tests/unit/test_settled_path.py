"""The settled path of commrt.all_reduce: once a call's algorithm gives the same schedule
on the next calls (settled, or a phase of auto's learning that runs one schedule), the next
call with the same signature runs the kept schedule without resolving, agreeing or
selecting (and, settled, without observing). These tests fail if that path is not taken, if it
gives a wrong answer, or if it swallows what the full path must still do: auto changing its
mind while it learns, COMMRT_DEBUG's check on every call, and the check of a new signature."""

import pytest
import torch
from helpers.local_transport import run_ranks

import commrt
from commrt.algorithms import Auto
from commrt.algorithms.auto import candidates, choices, learning
from commrt.algorithms.auto_learn import calls_to_settle
from commrt.collectives.memo import last_settled
from commrt.errors import CollectiveMismatchError
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.sim import Network

#: a model 1000x slower than the threads' mailbox: auto's choice misses its prediction, so
#: its runner-up and contenders are tried beside it before it settles
SLOW_NET = Network.flat(alpha_s=5e-3, beta_s_per_byte=1e-6)
#: 2 ranks: settled within calls_to_settle, and 20 calls more
CALLS = calls_to_settle(len(candidates(2))) + 20


def _comm(tr, timeout=10.0):
    info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
    return Communicator(tr, Backend.GLOO, info, timeout, 1 << 20)


@pytest.fixture
def asked(monkeypatch):
    """Every Auto.select and Auto.observe call: (rank, "select" | "observe", schedule name)."""
    seen = []
    select, observe = Auto.select, Auto.observe

    def counting_select(self, world_size, nbytes, comm=None):
        sched = select(self, world_size, nbytes, comm)
        seen.append((comm.rank, "select", sched.name))
        return sched

    def counting_observe(self, comm, nbytes, started_s):
        seen.append((comm.rank, "observe", None))
        return observe(self, comm, nbytes, started_s)

    monkeypatch.setattr(Auto, "select", counting_select)
    monkeypatch.setattr(Auto, "observe", counting_observe)
    return seen


def _inputs(rank: int, k: int) -> torch.Tensor:
    return torch.randn(3, generator=torch.Generator().manual_seed(100 * k + rank))


def test_a_settled_auto_call_runs_the_kept_schedule_without_select_or_observe(asked):
    auto = Auto(network=SLOW_NET)

    def body(tr):
        comm = _comm(tr)
        x = torch.empty(3)
        history = []  # per call: (selects, observes, phase before it, phase after it)
        for k in range(CALLS):
            mine = [what for r, what, _ in asked if r == tr.rank]
            t = learning(comm).get(12)
            phase = None if t is None else t.phase
            x.copy_(_inputs(tr.rank, k))
            commrt.all_reduce(x, comm, algorithm=auto, op="avg")
            # against a float64 reference: the mean of both ranks' inputs
            want = (_inputs(0, k).double() + _inputs(1, k).double()) / 2
            assert torch.allclose(x.double(), want, rtol=1e-6, atol=1e-7), (k, x, want)
            made = [what for r, what, _ in asked if r == tr.rank][len(mine) :]
            history.append((made.count("select"), made.count("observe"), phase))
            history[-1] += (learning(comm)[12].phase,)
            if len(history) > 20 and history[-20][3] == "settled":
                break
        kept = choices(comm)[12]
        return history, last_settled(comm).schedule is kept.schedule, learning(comm)[12]

    for history, runs_kept, tuning in run_ranks(2, body):
        settled_at = next(k for k, h in enumerate(history) if h[3] == "settled")
        assert tuning.trial_s, "the slow model should have made auto try other candidates"
        assert 5 < settled_at < CALLS - 10
        # no call selects or observes twice; every call of a timed phase (the baseline, the
        # trial) is observed, on the full path or, past a schedule's first two calls, by
        # the memo's timer (no select); a hold past its first two calls runs as a
        # settled call does
        assert all(s <= 1 and o <= 1 and s <= o for s, o, _, _ in history), history
        timed = [h for h in history[:settled_at] if h[2] in ("baseline", "trial")]
        assert timed and all(o == 1 for _, o, _, _ in timed), timed
        assert any(s == 0 for s, _, _, _ in timed), "the memo ran none of learning's calls"
        for k in range(2, settled_at):
            if history[k - 2][2] == history[k - 1][2] == history[k][2] == "hold":
                assert history[k][:2] == (0, 0), (k, history[k - 3 : k + 1])
        # none after it settled did, past the two calls after it that keep the kept
        # schedule (where the call that settled ran another)
        assert [h[:2] for h in history[settled_at + 3 :]] == [(0, 0)] * (
            len(history) - settled_at - 3
        )
        assert runs_kept  # the memo holds what auto kept (the learned choice, if it changed)


def test_a_settled_auto_call_takes_no_time_stamp(monkeypatch):
    # at 8 B over MPI a call takes 3.6 µs; a clock read and the timer's frames on every
    # settled call cost 0.2 µs more than its counter alone (auto settled 1.11x the fixed
    # schedule it kept, against 1.06x): only a timed phase's memo reads the clock
    import threading
    import time
    import types

    import commrt.collectives.core as core

    reads = {}

    def perf_counter():
        me = threading.get_ident()
        reads[me] = reads.get(me, 0) + 1
        return time.perf_counter()

    monkeypatch.setattr(core, "time", types.SimpleNamespace(perf_counter=perf_counter))
    auto = Auto(network=SLOW_NET, recheck_s=None)

    def body(tr):
        comm = _comm(tr)
        x = torch.ones(3)
        for _ in range(CALLS):
            commrt.all_reduce(x, comm, algorithm=auto, op="avg")
            if learning(comm)[12].phase == "settled":
                break
        for _ in range(3):  # the calls that keep the kept schedule
            commrt.all_reduce(x, comm, algorithm=auto, op="avg")
        before = reads.get(threading.get_ident(), 0)
        for _ in range(20):
            commrt.all_reduce(x, comm, algorithm=auto, op="avg")
        return learning(comm)[12].phase, reads.get(threading.get_ident(), 0) - before

    assert run_ranks(2, body) == [("settled", 0), ("settled", 0)]


def test_while_auto_learns_every_call_selects_and_it_changes_its_mind(asked):
    auto = Auto(network=SLOW_NET)

    def body(tr):
        comm = _comm(tr)
        x = torch.ones(3)
        for _ in range(CALLS):
            commrt.all_reduce(x, comm, algorithm=auto, op="avg")
        return learning(comm)[12]

    tunings = run_ranks(2, body)
    assert tunings[0].phase == "settled" and str(tunings[0]) == str(tunings[1])
    ran = [name for r, what, name in asked if r == 0 and what == "select"]
    # the trial ran the tried candidates beside the choice: more than one schedule
    assert len(set(ran)) >= 2, ran
    assert set(ran) >= {f"auto:{label}" for label in tunings[0].trial_s}


def test_op_dtype_and_shape_changes_leave_the_settled_path():
    def body(tr):
        comm = _comm(tr)
        x, d = torch.full((4,), tr.rank + 1.0), torch.full((4,), tr.rank + 1.0).double()
        out = []
        for _ in range(3):  # alternating: each call's signature differs from the last one's
            x.fill_(tr.rank + 1.0)
            out.append(commrt.all_reduce(x, comm, algorithm="rd", op="sum").tolist())
            x.fill_(tr.rank + 1.0)
            out.append(commrt.all_reduce(x, comm, algorithm="rd", op="avg").tolist())
            d.fill_(tr.rank + 1.0)
            out.append(commrt.all_reduce(d, comm, algorithm="rd", op="sum").tolist())
            x.fill_(tr.rank + 1.0)
            out.append(commrt.all_reduce(x[:2], comm, algorithm="rd", op="sum").tolist())
        return out

    want = [[3.0] * 4, [1.5] * 4, [3.0] * 4, [3.0] * 2] * 3
    assert run_ranks(2, body) == [want, want]


def test_a_settled_call_with_a_strided_tensor_or_its_own_timeout_is_still_right():
    """The settled path runs a contiguous tensor under the communicator's own options in
    place; a strided view goes through a contiguous copy written back, and a call's own
    timeout through the communicator's full run: both must give the same sums."""

    def body(tr):
        comm = _comm(tr)
        grid = torch.zeros(4, 2)
        out = []
        for k in range(3):
            x = torch.full((4,), tr.rank + 1.0 + k)
            out.append(commrt.all_reduce(x, comm, algorithm="rd", op="sum").tolist())
            col = grid[:, 1]  # the same signature, (4,) float32, but not contiguous
            col.fill_(tr.rank + 1.0 + k)
            commrt.all_reduce(col, comm, algorithm="rd", op="sum")
            out.append(grid.tolist())
            x.fill_(tr.rank + 1.0 + k)
            out.append(commrt.all_reduce(x, comm, algorithm="rd", op="avg", timeout=5).tolist())
        return out, last_settled(comm) is not None

    want = []
    for k in range(3):
        s = 3.0 + 2 * k
        want += [[s] * 4, [[0.0, s]] * 4, [s / 2] * 4]
    assert run_ranks(2, body) == [(want, True)] * 2


def test_a_new_signature_after_a_settled_one_is_still_checked_across_ranks():
    def body(tr):
        comm = _comm(tr)
        x = torch.ones(2)
        for _ in range(5):
            commrt.all_reduce(x, comm, algorithm="rd", op="sum")
        assert last_settled(comm) is not None  # the warm calls took the settled path
        # both new (a rank repeating the settled call while the other makes a new one is
        # COMMRT_DEBUG's to name): same bytes, different calls
        y = x.view(1, 2) if tr.rank == 1 else x.view(2, 1)
        with pytest.raises(
            CollectiveMismatchError,
            match=r"shape=\[1, 2\].*shape=\[2, 1\]|shape=\[2, 1\].*shape=\[1, 2\]",
        ):
            commrt.all_reduce(y, comm, algorithm="rd", op="sum")
        return True

    assert run_ranks(2, body) == [True, True]


def test_debug_checks_every_call_and_never_takes_the_settled_path(asked):
    auto = Auto(network=SLOW_NET)

    def body(tr):
        comm = _comm(tr)
        comm.debug = True
        x = torch.zeros(3)  # summed in place CALLS times: ones would overflow
        for _ in range(CALLS):
            commrt.all_reduce(x, comm, algorithm=auto, op="sum")
        return last_settled(comm), learning(comm)[12].phase

    assert run_ranks(2, body) == [(None, "settled")] * 2
    assert sum(r == 0 and what == "select" for r, what, _ in asked) == CALLS


def test_debug_turned_on_after_calls_settled_checks_the_next_call():
    """Under debug nothing is remembered, so the collectives' path never asks whether it
    is on; turning it on later forgets what was agreed and settled. Both ranks settled
    two calls of the same bytes in two shapes; then each makes one of them: only a check
    tells them apart."""

    def body(tr):
        comm = _comm(tr)
        x = torch.ones(2)
        tall, wide = x.view(2, 1), x.view(1, 2)
        for _ in range(3):
            commrt.all_reduce(tall, comm, algorithm="rd", op="sum")
            commrt.all_reduce(wide, comm, algorithm="rd", op="sum")
        assert last_settled(comm) is not None
        comm.debug = True
        with pytest.raises(CollectiveMismatchError, match=r"COMMRT_DEBUG"):
            commrt.all_reduce(tall if tr.rank == 0 else wide, comm, algorithm="rd", op="sum")
        return last_settled(comm) is None

    assert run_ranks(2, body) == [True, True]


def test_calls_alternating_between_settled_sizes_skip_select_and_observe(asked):
    auto = Auto(network=SLOW_NET)

    def body(tr):
        comm = _comm(tr)
        small, large = torch.empty(3), torch.empty(5, 2)
        made = []
        for k in range(CALLS):
            before = sum(r == tr.rank for r, _, _ in asked)
            for x in (small, large):  # the last call's memo never matches: each from the table
                x.copy_(_inputs(tr.rank, k).repeat(4)[: x.numel()].view_as(x))
                commrt.all_reduce(x, comm, algorithm=auto, op="sum")
                want = _inputs(0, k).double().repeat(4) + _inputs(1, k).double().repeat(4)
                assert torch.allclose(x.double().flatten(), want[: x.numel()], atol=1e-6)
            made.append(sum(r == tr.rank for r, _, _ in asked) - before)
        phases = {n: t.phase for n, t in learning(comm).items()}
        return made, phases, len(comm.executor.settled)

    for made, phases, settled in run_ranks(2, body):
        assert phases == {12: "settled", 40: "settled"} and settled == 2
        assert made[:3] == [4, 4, 4]  # both sizes selected and observed while learning
        assert made[-10:] == [0] * 10  # neither, once both settled
