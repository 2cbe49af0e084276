"""The small-message path: a repeated all-reduce on one buffer runs from the
executor's memo of its last binding, the common tensor check is a handful of attribute reads,
small CPU pieces are added by numpy; none of it may skip a check, run a freed binding or lose
an error's names. Speed itself is bench/bench_allreduce.py's (test_small_interleaved), never
asserted here."""

import re

import pytest
import torch
from helpers.local_transport import run_ranks
from helpers.mp import mpiexec

import commrt
from commrt.algorithms import resolve
from commrt.errors import CommTimeoutError
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.schedule.caches import Bindings
from commrt.schedule.executor import Executor


def _comm(tr, timeout=10.0):
    info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
    return Communicator(tr, Backend.GLOO, info, timeout, 1 << 20)


class _CountingBindings(Bindings):
    """Counts bind() calls: the memo must spare a repeated call from making its key."""

    def __init__(self, reduce):
        super().__init__(reduce)
        self.binds = 0

    def bind(self, *args, **kwargs):
        self.binds += 1
        return super().bind(*args, **kwargs)


class _CountingExecutor(Executor):
    """An executor whose bindings count bind() calls (``binds``)."""

    def __init__(self):
        super().__init__()
        self.bindings = _CountingBindings(self.reduce)

    @property
    def binds(self) -> int:
        return self.bindings.binds


def test_a_repeated_call_skips_bind_and_a_changed_buffer_does_not():
    def body(tr):
        comm = _comm(tr)
        comm.executor = ex = _CountingExecutor()
        x = torch.zeros(2, dtype=torch.float64)
        for k in range(5):
            x.fill_(tr.rank + k)
            commrt.all_reduce(x, comm, algorithm="rd", op="sum")
            assert x.tolist() == [1 + 2 * k] * 2
        first = ex.binds
        x.set_(torch.full((2,), 3.0, dtype=torch.float64))  # same tensor, new memory
        commrt.all_reduce(x, comm, algorithm="rd", op="sum")
        moved = (ex.binds, x.tolist())
        # same address, same element count, another dtype: another binding (its adds differ)
        y = x.view(torch.int64)
        y.fill_(tr.rank + 1)
        commrt.all_reduce(y, comm, algorithm="rd", op="sum")
        return first, moved, ex.binds, y.tolist()

    for first, moved, last, y in run_ranks(2, body):
        assert first == 1  # four of five calls came from the memo
        assert moved == (2, [6.0, 6.0])
        assert last == 3 and y == [3, 3]


def test_the_memo_never_runs_a_binding_the_cache_freed():
    def body(tr):
        ex = Executor()
        sched = resolve("rd").schedule(2)
        x = torch.full((3,), float(tr.rank + 1))
        ex.run(sched, x, tr, timeout=10)
        # 40 other bindings push x's, the memo's, out of the LRU (its requests are freed)
        others = [torch.ones(n + 4) for n in range(40)]
        for o in others:
            ex.bindings.bind(sched, o, tr, 1 << 20)
        x.fill_(tr.rank + 1)
        ex.run(sched, x, tr, timeout=10)
        return x.tolist()

    assert run_ranks(2, body) == [[3.0] * 3, [3.0] * 3]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16]
)
@pytest.mark.parametrize("n", [1, 5, 40000])  # 40000: above the numpy limit, torch adds
def test_small_cpu_adds_match_torch_bit_for_bit(dtype, n):
    g = torch.Generator().manual_seed(n)
    xs = [(torch.randn(n, generator=g) * 1000).to(dtype) for _ in range(2)]
    if not dtype.is_floating_point:  # wrap around as torch's add_ does
        info = torch.iinfo(dtype)
        xs = [torch.randint(info.max // 2, info.max, (n,), generator=g, dtype=dtype) for _ in xs]
    want = xs[0] + xs[1]

    def body(tr):
        x = xs[tr.rank].clone()
        Executor().run(resolve("rd").schedule(2), x, tr, timeout=10)
        return x

    for out in run_ranks(2, body):
        assert torch.equal(out, want)


def test_small_cpu_pieces_are_added_by_numpy_large_ones_by_torch(monkeypatch):
    import numpy as np

    import commrt.schedule.bound as ex_mod

    adds = []

    class _Numpy:  # the executor's numpy, counting the adds it makes
        @staticmethod
        def add(a, b, out):
            adds.append(a.size)
            return np.add(a, b, out)

    monkeypatch.setattr(ex_mod, "np", _Numpy)

    def body(tr):
        ex, sched = Executor(), resolve("rd").schedule(2)
        small, large = torch.ones(2), torch.ones(40000)
        ex.run(sched, small, tr, timeout=10)
        ex.run(sched, large, tr, timeout=10)
        return small.tolist(), large.sum().item()

    assert run_ranks(2, body) == [([2.0, 2.0], 80000.0)] * 2
    assert adds == [2, 2]  # one small add per rank; the large piece went to torch


def test_the_quick_tensor_check_rejects_what_the_full_one_does():
    def body(tr):
        comm = _comm(tr)
        with pytest.raises(ValueError, match="requires grad"):
            commrt.all_reduce(torch.ones(2, requires_grad=True), comm)
        with pytest.raises(ValueError, match="requires grad"):
            commrt.all_reduce(torch.nn.Parameter(torch.ones(2)), comm)
        with pytest.raises(ValueError, match="op='avg' needs a floating-point tensor"):
            commrt.all_reduce(torch.ones(2, dtype=torch.int64), comm, op="avg")
        with pytest.raises(ValueError, match="unsupported dtype torch.int8"):
            commrt.all_reduce(torch.ones(2, dtype=torch.int8), comm, op="sum")
        with pytest.raises(ValueError, match="tensor is on meta"):
            commrt.all_reduce(torch.ones(2, device="meta"), comm)
        with pytest.raises(TypeError, match="expected a torch.Tensor"):
            commrt.all_reduce([1.0, 2.0], comm)
        # a subclass the quick check does not know is checked in full, and accepted
        p = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        return commrt.all_reduce(p, comm, op="sum").tolist()

    assert run_ranks(2, body) == [[2.0, 2.0]] * 2


def test_a_timeout_on_a_memo_call_names_rank_peer_algorithm_and_step():
    def body(tr):
        comm = _comm(tr, timeout=0.3)
        comm.executor = ex = _CountingExecutor()
        x = torch.ones(2)
        for _ in range(3):
            commrt.all_reduce(x, comm, algorithm="rd", op="sum")
        if tr.rank == 1:
            return None  # rank 1 stays away from the fourth call
        commrt.all_reduce(x, comm, algorithm="rd", op="sum")
        return ex.binds

    with pytest.raises(CommTimeoutError) as ei:
        run_ranks(2, body)
    e = ei.value
    assert (e.rank, e.peer, e.algorithm, e.step, e.what) == (0, 1, "recursive_doubling", 0, "recv")


def _lines(out: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^rank (\d) (raised .*|: no error)$", out, re.M)}


def test_mpi_debug_check_still_runs_on_every_warm_call():
    out = mpiexec(2, "small_worker.py", "debug", env={"COMMRT_DEBUG": "1"}, timeout=120).stdout
    assert out.count(" sum 4") == 2, out  # 50 warm calls, each right
    lines = _lines(out)
    for r in (0, 1):
        assert lines[r].startswith("raised CollectiveMismatchError"), out
        assert "shape=[1, 2]" in lines[r] and "shape=[2]" in lines[r], out
        assert "COMMRT_DEBUG" in lines[r], out


def test_mpi_peer_that_closed_is_named_on_a_warm_call():
    out = mpiexec(2, "small_worker.py", "closed", timeout=120).stdout
    line = _lines(out)[0]
    assert line.startswith("raised PeerClosedError"), out
    assert "rank 1 closed its communicator" in line, out


@pytest.mark.slow
def test_mpi_timeout_on_a_warm_call_names_the_peer_and_the_step():
    out = mpiexec(2, "small_worker.py", "timeout", timeout=120).stdout
    line = _lines(out)[0]
    assert line.startswith("raised CommTimeoutError"), out
    assert "rank 0 timed out after 0.5 s waiting for recv from rank 1" in line, out
    assert "algorithm auto:" in line and "step 0 of" in line, out
