"""The executor on an in-process transport: every algorithm, many world sizes.

Exact comparisons: float64 sums of small integers are exact, so the result
must equal the reference bit for bit, whatever the order of additions.
"""

import pytest
import torch
from helpers.local_transport import run_ranks

from commrt.algorithms import HalvingDoubling, RecursiveDoubling, Ring, resolve
from commrt.errors import CommError, CommTimeoutError
from commrt.schedule import Collective
from commrt.schedule.executor import Executor
from commrt.schedule.plan import compile_plan
from commrt.transports.base import Traits


def _inputs(p, n, dtype=torch.float64):
    return [
        torch.randint(-50, 50, (n,), generator=torch.Generator().manual_seed(r)).to(dtype)
        for r in range(p)
    ]


@pytest.mark.parametrize("alg", [Ring(), HalvingDoubling(), RecursiveDoubling()], ids=str)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8])
@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_all_reduce_exact(alg, p, n):
    xs = _inputs(p, n)
    want = torch.stack(xs).sum(0)
    sched = alg.schedule(p)

    def body(tr):
        buf = xs[tr.rank].clone()
        # small pieces so that multi-piece pipelining is exercised
        Executor().run(sched, buf, tr, timeout=10, piece_bytes=1024)
        return buf

    for r, out in enumerate(run_ranks(p, body)):
        assert torch.equal(out, want), f"rank {r}"


@pytest.mark.parametrize("p", [2, 3, 4])
def test_float32_and_bf16_sums(p):
    """The executor sums; an average is its caller's scale before the run (commrt.collectives)."""
    xs = _inputs(p, 999, torch.float32)
    want = torch.stack(xs).double().sum(0)
    sched = Ring().schedule(p)

    def body(tr):
        a = xs[tr.rank].clone()
        b = xs[tr.rank].to(torch.bfloat16)
        ex = Executor()
        ex.run(sched, a, tr, timeout=10)
        ex.run(sched, b, tr, timeout=10)
        return a, b

    for a, b in run_ranks(p, body):
        torch.testing.assert_close(a.double(), want, rtol=1e-6, atol=1e-6)
        # values are integers |x| < 50 and sums < 200: each bf16 add rounds to 8 bits
        torch.testing.assert_close(b.double(), want, rtol=2**-7 * p, atol=0.5)


@pytest.mark.parametrize("p", [3, 4])
def test_subset_schedule_leaves_others_alone(p):
    xs = _inputs(p, 50)
    ranks = tuple(range(1, p))
    sched = Ring().schedule(p, ranks=ranks)
    want = torch.stack(xs[1:]).sum(0)

    def body(tr):
        buf = xs[tr.rank].clone()
        Executor().run(sched, buf, tr, timeout=10)
        return buf

    out = run_ranks(p, body)
    assert torch.equal(out[0], xs[0])
    for r in ranks:
        assert torch.equal(out[r], want)


def test_reduce_scatter_owners_get_their_chunk():
    p, n = 4, 103
    xs = _inputs(p, n)
    sched = Ring().schedule(p, collective=Collective.REDUCE_SCATTER)
    want = torch.stack(xs).sum(0)

    def body(tr):
        buf = xs[tr.rank].clone()
        Executor().run(sched, buf, tr, timeout=10)
        return buf

    out = run_ranks(p, body)
    from commrt.schedule import chunk_bounds

    b = chunk_bounds(n, sched.num_chunks)
    for c, owner in enumerate(sched.owners):
        assert torch.equal(out[owner][b[c] : b[c + 1]], want[b[c] : b[c + 1]])


def test_plan_pieces_and_scratch():
    plan = compile_plan(Ring().schedule(4), rank=0, numel=4000, piece_elems=300)
    first = plan.steps[0]
    assert [x.stop - x.start for x in first.sends] == [300, 300, 300, 100]
    assert all(x.reduce and x.scratch >= 0 for x in first.recvs)
    assert plan.scratch_numel == 1000
    # all-gather copies land in place: no scratch, no waiting for sends
    ag = plan.steps[3]
    assert all(not x.reduce and x.scratch == -1 for x in ag.recvs) and not any(ag.after_sends)
    # empty chunks produce no messages at all
    tiny = compile_plan(Ring().schedule(4), rank=3, numel=1, piece_elems=300)
    assert all(x.stop > x.start for st in tiny.steps for x in st.sends + st.recvs)


def test_timeout_names_rank_peer_algorithm_step():
    sched = Ring().schedule(2)

    def body(tr):
        if tr.rank == 1:
            return None  # rank 1 never takes part
        Executor().run(sched, torch.ones(10), tr, timeout=0.3, bucket=5)

    with pytest.raises(CommTimeoutError) as ei:
        run_ranks(2, body)
    e = ei.value
    assert (e.rank, e.peer, e.algorithm, e.step, e.bucket, e.what) == (0, 1, "ring", 0, 5, "recv")
    assert e.where == "algorithm ring, step 0 of 2, bucket 5"  # what a one-line report names
    assert (
        "rank 0 timed out after 0.3 s waiting for recv from rank 1 (algorithm ring, step 0 of 2, bucket 5)"
        in str(e)
    )


def _local_comm(tr):
    from commrt.process.environment import LaunchInfo
    from commrt.runtime.choice import Backend
    from commrt.runtime.communicator import Communicator

    return Communicator(
        tr, Backend.GLOO, LaunchInfo("none", tr.rank, tr.world_size, 0, None), 10.0, 1 << 20
    )


def test_all_reduce_any_shape_and_non_contiguous_in_place():
    import commrt

    p = 3
    base = [torch.arange(24.0).reshape(4, 6) * (r + 1) for r in range(p)]

    def body(tr):
        comm = _local_comm(tr)
        m = base[tr.rank].clone()
        view = m.t()  # non-contiguous
        assert not view.is_contiguous()
        out = commrt.all_reduce(view, comm, op="sum")
        return m, out is view

    for m, same in run_ranks(p, body):
        assert same
        torch.testing.assert_close(m, torch.arange(24.0).reshape(4, 6) * 6)


def test_all_reduce_rejects_wrong_device():
    import commrt

    def body(tr):
        with pytest.raises(
            ValueError, match="tensor is on meta but the gloo communicator works on cpu"
        ):
            commrt.all_reduce(torch.zeros(3, device="meta"), _local_comm(tr))

    run_ranks(1, body)


def test_swap_in_place_waits_for_the_send_before_writing_back():
    # both ranks send chunk 0 and receive the peer's chunk 0 into the same place
    from commrt.schedule import Op, OpKind, Schedule, Step

    step = Step.of(
        [
            Op(OpKind.SEND, 0, 1, 0, 1),
            Op(OpKind.RECV_COPY, 0, 1, 0, 1),
            Op(OpKind.SEND, 1, 0, 0, 1),
            Op(OpKind.RECV_COPY, 1, 0, 0, 1),
        ],
        "swap",
    )
    sched = Schedule("swap", Collective.ALL_REDUCE, 2, (0, 1), 1, (step,))
    plan = compile_plan(sched, 0, 10, 4)
    assert all(x.scratch >= 0 for x in plan.steps[0].recvs)
    # pieces [0,4) [4,8) [8,10): each write-back waits only for the send piece it overwrites
    assert plan.steps[0].after_sends == (1, 2, 3)

    def body(tr):
        buf = torch.full((10,), float(tr.rank))
        Executor().run(sched, buf, tr, timeout=10, piece_bytes=16)
        return buf

    out = run_ranks(2, body)
    assert torch.equal(out[0], torch.ones(10)) and torch.equal(out[1], torch.zeros(10))


def test_steady_state_call_reuses_its_binding_and_compiles_nothing(monkeypatch):
    import commrt
    import commrt.schedule.caches as ex_mod

    compiled = []
    real = ex_mod.compile_plan
    monkeypatch.setattr(ex_mod, "compile_plan", lambda *a: compiled.append(a[1:]) or real(*a))

    def body(tr):
        comm = _local_comm(tr)
        x = torch.ones(7, dtype=torch.float64)
        bindings = []
        for _ in range(5):
            commrt.all_reduce(x, comm, algorithm="recursive_doubling", op="sum")
            bindings.append(comm.executor.bindings.cached())
        y = torch.ones(7, dtype=torch.float64)  # another buffer: its own binding, same plan
        commrt.all_reduce(y, comm, algorithm="rd", op="sum")
        return x, y, bindings, len(comm.executor.bindings)

    for x, y, bindings, n_bound in run_ranks(2, body):
        assert torch.equal(x, torch.full((7,), 32.0)) and torch.equal(y, torch.full((7,), 2.0))
        assert all(b == bindings[0] and len(b) == 1 for b in bindings)  # the same Bound object
        assert n_bound == 2
    assert sorted(compiled) == [(0, 7, 1 << 17), (1, 7, 1 << 17)]  # one plan per rank, ever


def test_poll_until_spins_before_yielding_and_still_times_out(monkeypatch):
    import time

    from commrt.transports import base

    yields = []
    monkeypatch.setattr(base.os, "sched_yield", lambda: yields.append(1))
    t_ready = time.monotonic() + 2e-3
    assert base.poll_until(lambda: time.monotonic() > t_ready, time.monotonic() + 5, spin_s=1.0)
    assert yields == []  # caught while spinning
    t_ready = time.monotonic() + 2e-3
    assert base.poll_until(lambda: time.monotonic() > t_ready, time.monotonic() + 5)
    assert yields  # no spin: the core is yielded between polls
    t0 = time.monotonic()
    # the deadline bounds the spin
    assert not base.poll_until(lambda: False, t0 + 0.05, spin_s=10.0)
    assert time.monotonic() - t0 < 1.0


def test_spin_only_when_every_local_rank_has_a_core():
    import os

    from commrt.runtime.communicator import SPIN_S, _spin_s

    cores = len(os.sched_getaffinity(0))
    assert _spin_s(1) == SPIN_S > 0 and _spin_s(cores) == SPIN_S
    assert _spin_s(cores + 1) == 0.0 and _spin_s(None) == 0.0


def test_a_dead_owners_binding_is_freed_by_the_next_run_even_one_without_an_owner():
    """A binding cached for an owner that died holds the owner's memory through its views:
    the next run frees it, also a run that caches nothing (the shards' fresh buffers)."""
    import gc
    import weakref

    def body(tr):
        ex, sched = Executor(), resolve("rd").schedule(2)
        x = torch.ones(1000)
        ex.run(sched, x, tr, 10.0, 4 << 20, None, None, None, x)
        storage = weakref.ref(x.untyped_storage())
        cached = len(ex.bindings)
        del x
        gc.collect()
        y = torch.ones(10)
        ex.run(sched, y, tr, 10.0)  # no owner: bound for this run alone
        gc.collect()
        return cached, len(ex.bindings), storage() is None, y.tolist()

    for cached, left, freed, y in run_ranks(2, body):
        assert (cached, left, freed) == (1, 0, True) and y == [2.0] * 10


@pytest.mark.parametrize("error", ["closed", "failed"])
def test_a_peer_that_left_or_failed_is_named_with_where_this_rank_waited(monkeypatch, error):
    """A peer's farewell ends the wait; the error says which algorithm, step and bucket
    this rank waited in, whether the peer closed or ended after a failure."""
    from helpers import local_transport

    from commrt.errors import PeerClosedError, PeerFailedError

    gone = {
        "closed": PeerClosedError(
            rank=0, peer=1, how="exited", unit="collective call", peer_done=0, waiting_in=1
        ),
        "failed": PeerFailedError(rank=0, peer=1, cause=2, unit="collective call", waiting_in=1),
    }[error]

    def farewell(self, i, deadline):
        raise gone

    monkeypatch.setattr(local_transport._Pending, "wait_recv", farewell)
    with pytest.raises(type(gone)) as ei:
        run_ranks(
            2, lambda tr: Executor().run(Ring().schedule(2), torch.ones(10), tr, 5.0, bucket=3)
        )
    assert ei.value.where == "algorithm ring, step 0 of 2, bucket 3"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_same_dtype_sum_off_the_cpu_is_one_add_not_a_kernel_launch(dtype):
    """On a device (meta stands in for CUDA here: only the device type is read), a received
    piece of the buffer's own dtype is added with ``add_``, which rounds as the fused kernel
    does, without its launch; a piece of another dtype (a bf16 wire into fp32) goes through
    the kernel, which casts and adds in one pass."""
    from commrt.kernels import reduce_
    from commrt.schedule.bound import _applier, default_reduce

    dst = torch.empty(64, dtype=dtype, device="meta")
    same = _applier(dst, torch.empty(64, dtype=dtype, device="meta"), True, default_reduce)
    assert same.func == dst.add_
    wire = torch.empty(64, dtype=torch.bfloat16 if dtype is not torch.bfloat16 else torch.float16)
    mixed = _applier(dst, wire.to("meta"), True, default_reduce)
    assert mixed.func is reduce_


def test_a_peer_gone_while_the_stream_still_runs_is_named_as_a_steps_failure(monkeypatch):
    """On a stream-ordered transport the host's last wait is for the stream itself; a peer
    whose process ended meanwhile (its copies may never run) is named there as in a step:
    the transport, the algorithm and bucket, the peers, and what it most likely means."""
    from helpers.local_transport import LocalTransport

    def gone(self, deadline):
        raise RuntimeError(f"local: rank 1's process (pid 7) is gone while rank {self.rank} waits")

    monkeypatch.setattr(LocalTransport, "traits", Traits(stream_ordered=True))
    monkeypatch.setattr(LocalTransport, "sync", gone)
    with pytest.raises(CommError) as ei:
        run_ranks(
            2, lambda tr: Executor().run(Ring().schedule(2), torch.ones(10), tr, 5.0, bucket=3)
        )
    said = str(ei.value)
    assert said.startswith("commrt: rank ") and "local failed in algorithm ring, bucket 3" in said
    assert "(peers [" in said and "process ended without a farewell" in said, said
    assert ei.value.where == "algorithm ring, bucket 3"
