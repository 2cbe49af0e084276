"""NCCL safety rules that run in one process, with fakes (no GPU, no NCCL).

* a timeout or an NCCL error aborts the communicator and marks the transport
  unusable; close() then never calls destroy() (which would hang);
* check_async_error() is polled while waiting: a failure is named at once;
* the watchdog aborts a blocked call, and ends the process if it stays stuck;
* tensors read on another stream live until that stream passed the read;
* GradientSync tunes its kernels at construction, not in the first backward.

The fakes check commrt's own logic around these calls; nothing here says
anything about NCCL, CUDA or a GPU.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import types
import weakref

import pytest
import torch

import commrt
from commrt.errors import CommError, CommTimeoutError
from commrt.kernels import lifetime
from commrt.sync import buffers as B
from commrt.sync.buckets import Bucket
from commrt.transports.nccl import NcclTransport
from commrt.transports.nccl_module import NcclModule
from commrt.transports.watchdog import Watchdog


class FakeEvent:
    def __init__(self, stream):
        self.stream, self.at = stream, stream.enqueued

    def query(self) -> bool:
        return self.stream.ran >= self.at


class FakeStream:
    """A stream that runs its work only when the test says so."""

    ptr = 0x77

    def __init__(self):
        self.enqueued = self.ran = 0

    def record(self) -> FakeEvent:
        return FakeEvent(self)

    def run_all(self) -> None:
        self.ran = self.enqueued


class FakeNccl(NcclModule):
    """cupy.cuda.nccl's calls, recording them; the group's work never runs by itself."""

    def __init__(self, error: Exception | None = None, block_group_end: bool = False):
        self.stream = FakeStream()
        self.log: list[str] = []
        self.error, self.block = error, block_group_end
        self.unblock = threading.Event()
        outer = self

        class NcclCommunicator:
            def __init__(self, ndev, commId, rank):  # noqa: N803
                pass

            def send(self, *a):
                outer.stream.enqueued += 1

            recv = send

            def check_async_error(self):
                if outer.error is not None:
                    raise outer.error

            def abort(self):
                outer.log.append("abort")
                outer.unblock.set()

            def destroy(self):
                outer.log.append("destroy")

        self.communicator = NcclCommunicator

    def get_unique_id(self):
        return bytes(128)

    def NcclCommunicator(self, ndev, commId, rank):  # noqa: N802,N803
        return self.communicator(ndev, commId, rank)

    def HostStream(self):  # noqa: N802
        return self.stream

    def groupStart(self):  # noqa: N802
        pass

    def groupEnd(self):  # noqa: N802
        if self.block:  # a new pair's connection: returns only when aborted
            self.unblock.wait(30)
            raise RuntimeError("NCCL error: remote process exited or there was a network error")


def _transport(nccl, timeout=0.3):
    return NcclTransport(0, 2, b"\0" * 128, torch.device("cpu"), nccl=nccl, timeout=timeout)


def test_a_module_that_does_not_declare_the_nccl_calls_is_refused():
    with pytest.raises(TypeError, match="must be a .*NcclModule.*got SimpleNamespace"):
        _transport(types.SimpleNamespace(groupStart=None))


def test_a_timeout_aborts_and_close_never_destroys():
    nccl = FakeNccl()
    t = _transport(nccl)
    pend = t.exchange([(torch.ones(4), 1)], [(torch.zeros(4), 1)], 0)
    start = time.monotonic()
    assert not pend.wait_recv(0, time.monotonic() + 0.2)  # the peer never comes
    assert time.monotonic() - start < 2
    assert nccl.log == ["abort"] and "did not finish" in t.broken
    with pytest.raises(CommError, match="unusable .*make a new one"):
        t.exchange([(torch.ones(4), 1)], [], 0)
    t.close()
    assert "destroy" not in nccl.log  # destroy() would wait for the stuck group forever


def test_close_after_clean_work_destroys_and_stuck_work_aborts():
    nccl = FakeNccl()
    t = _transport(nccl)
    t.exchange([(torch.ones(4), 1)], [], 0)
    nccl.stream.run_all()
    t.close()
    assert nccl.log == ["destroy"]
    nccl = FakeNccl()
    t = _transport(nccl)
    t.exchange([(torch.ones(4), 1)], [], 0)  # never completes
    t.close()  # bounded by the timeout, then abort instead of destroy
    assert nccl.log == ["abort"] and t.broken


def test_an_async_error_is_named_at_once_not_after_the_timeout():
    nccl = FakeNccl()
    t = _transport(nccl, timeout=60)
    pend = t.exchange([], [(torch.zeros(4), 1)], 0)
    nccl.error = RuntimeError("NCCL error: remote process exited or there was a network error")
    start = time.monotonic()
    with pytest.raises(CommError, match="rank 0: NCCL failed: .*network error"):
        pend.wait_recv(0, time.monotonic() + 60)
    assert time.monotonic() - start < 1 and nccl.log == ["abort"]


def test_the_watchdog_aborts_a_stuck_groupend_and_names_it():
    nccl = FakeNccl(block_group_end=True)
    t = _transport(nccl, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"connection setup in groupEnd \(peers \[1\]\)"):
        t.exchange([(torch.ones(4), 1)], [], 0)
    assert 0.4 < time.monotonic() - start < 3
    assert nccl.log == ["abort"] and t.broken == "groupEnd timed out"


def test_the_watchdog_ends_the_process_when_the_call_stays_stuck():
    exits, aborted = [], []
    stuck = threading.Event()
    dog = Watchdog(grace_s=0.3, exit=exits.append)
    with dog.guard(0.2, lambda: aborted.append(1), "rank 0: groupEnd") as w:
        stuck.wait(1.5)  # the abort did not unblock it
    assert aborted == [1] and exits == [1] and w.fired
    # the same thread guards the next calls; a call that returns in time fires nothing
    for _ in range(100):
        with dog.guard(5, lambda: aborted.append(2), "fast") as fast:
            pass
    time.sleep(0.2)
    assert not fast.fired and aborted == [1] and exits == [1]
    with dog.guard(0.1, lambda: aborted.append(3), "slow, then returns") as slow:
        time.sleep(0.25)  # the abort makes it return within the grace
    time.sleep(0.5)
    assert slow.fired and aborted == [1, 3] and exits == [1]


# ------------------------------------------------------------ cross-stream lifetimes
def test_keep_alive_holds_tensors_until_the_stream_passes_them():
    stream = FakeStream()
    t = torch.ones(10)
    ref = weakref.ref(t)
    stream.enqueued += 1  # a copy reading t is queued
    lifetime.keep_alive([t], stream)
    del t
    gc.collect()
    assert ref() is not None and lifetime.held() >= 1
    stream.run_all()
    lifetime.held()  # prunes
    gc.collect()
    assert ref() is None
    lifetime.keep_alive([torch.ones(1)])  # CPU without a stream: host work is synchronous
    assert lifetime.held() == 0


def test_a_replaced_gradient_outlives_its_copy_on_the_comm_stream():
    """grad_views: a gradient that is not the bucket's view (replaced by the user) is copied
    in on the comm stream; zero_grad(set_to_none) right after must not free it early."""
    p = torch.nn.Parameter(torch.zeros(6))
    bufs = B.BucketBuffers([Bucket(0, (p,), ("w",), (0,), 6)], torch.float32, p.device, True)
    stream = bufs.stream = FakeStream()
    p.grad = torch.full((6,), 2.0)  # replaced: no longer the bucket's view
    ref = weakref.ref(p.grad)
    stream.enqueued += 1
    bufs.pack(0, 0.5)
    p.grad = None  # zero_grad(set_to_none=True)
    gc.collect()
    assert ref() is not None, "freed while the comm stream may still read it"
    stream.run_all()
    lifetime.held()
    gc.collect()
    assert ref() is None and torch.equal(bufs.buffers[0], torch.ones(6))


# ------------------------------------------------------------ autotuning at construction
def test_kernels_are_tuned_when_gradient_sync_is_built(monkeypatch):
    """On CUDA the first pack/unpack launch autotunes: GradientSync does it at construction
    (here CPU tensors stand in, with the CUDA check and the kernels faked)."""
    calls = []
    monkeypatch.setattr(B, "needs_tuning", lambda device: True)
    monkeypatch.setattr(B, "pack", lambda grads, out, scale: calls.append(("pack", out.numel())))
    monkeypatch.setattr(B, "unpack", lambda flat, grads: calls.append(("unpack", flat.numel())))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    with commrt.init("gloo") as comm:
        sync = commrt.GradientSync(model, comm, comm_dtype=torch.bfloat16, bucket_mb=0.0001)
        tuned = list(calls)
        assert {k for k, _ in tuned} == {"pack", "unpack"}
        assert sorted(n for k, n in tuned if k == "pack") == sorted(b.numel for b in sync.buckets)
        # no gradient touched: each is its bucket's view, still zero
        assert all(not p.grad.any() for p in model.parameters())
        sync.close()
    calls.clear()
    with commrt.init("gloo") as comm:  # fp32 views on the wire: nothing to tune
        monkeypatch.setattr(B, "needs_tuning", lambda device: device.type == "cuda")
        commrt.GradientSync(model, comm).close()
    assert calls == []


def test_the_reduce_kernel_is_warmed_at_construction_on_every_piece_size(monkeypatch):
    """The reduce kernel autotunes on its first launch per size too: the all-reduce family
    launches it at construction on each piece size its schedules will sum, on scratch zeros."""
    from commrt.algorithms import Ring
    from commrt.schedule.executor import Executor

    sched, numel, piece_bytes = Ring().schedule(4), 1001, 4 * 100
    seen = []
    ex = Executor(reduce=lambda dst, src: seen.append((dst.numel(), dst.sum().item())))
    buf = torch.arange(numel, dtype=torch.float32)
    assert ex.warm(sched, 1, buf, piece_bytes) == len(seen) > 1
    plan = ex.bindings.plan(sched, 1, numel, 100)
    reduced = {x.stop - x.start for st in plan.steps for x in st.recvs if x.reduce}
    assert sorted(n for n, _ in seen) == sorted(reduced) and all(v == 0 for _, v in seen)
    assert torch.equal(buf, torch.arange(numel, dtype=torch.float32))  # the buffer untouched

    warmed = []
    monkeypatch.setattr(B, "needs_tuning", lambda device: True)
    monkeypatch.setattr(Executor, "warm", lambda self, s, rank, b, pb: warmed.append(b.numel()))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    with commrt.init("gloo") as comm:
        sync = commrt.GradientSync(model, comm, bucket_mb=0.0001)
        assert sorted(warmed) == sorted(b.numel for b in sync.buckets)
        sync.close()
    warmed.clear()
    with commrt.init("gloo") as comm:  # CPU: nothing autotunes, nothing is launched
        monkeypatch.setattr(B, "needs_tuning", lambda device: device.type == "cuda")
        monkeypatch.setattr(B, "needs_tuning", lambda device: device.type == "cuda")
        commrt.GradientSync(model, comm).close()
    assert warmed == []


# ------------------------------------------------------------ the GPU tests' harness, on CPU
def _report_env(q):
    import os as _os

    from commrt.kernels._triton import interpret_mode

    q.put(("env", (_os.environ.get("TRITON_INTERPRET"), interpret_mode())))


def _hang(q):
    time.sleep(600)


@pytest.mark.slow
def test_gpu_workers_start_without_triton_interpret_and_hung_ones_are_killed():
    """tests/gpu/test_gpu.py's workers must run the compiled kernels: conftest's TRITON_INTERPRET
    is not inherited (the worker's Triton is not in interpreter mode), and a worker that hangs
    is killed at the timeout, failing its test."""
    from helpers.gpu import spawn

    assert os.environ.get("TRITON_INTERPRET") == "1"  # conftest's, for the CPU tests
    assert spawn([(_report_env, ())], timeout=120) == {"env": (None, False)}
    assert os.environ.get("TRITON_INTERPRET") == "1"  # restored
    start = time.monotonic()
    with pytest.raises(AssertionError, match="hung GPU workers killed"):
        spawn([(_hang, ())], timeout=3)
    assert time.monotonic() - start < 60


def test_a_catch_up_nccl_cannot_retry_fails_the_policy_and_close_does_not_drain():
    """On NCCL a failed catch-up receive is raised, not retried; the backup policy then
    closes without trying to drain (which would use the aborted transport)."""
    import types

    from commrt.algorithms import BackupWorkers
    from commrt.sync.backup import BackupPolicy, Role
    from commrt.sync.backup.parts import Parts

    calls = []

    class CatchUp:
        def receive(self, req, step, opt):
            calls.append("receive")
            raise CommError("rank 3: catch-up receive failed; NCCL cannot cancel it")

        def request(self, step):
            calls.append("request")

        def close(self):
            calls.append("close")

    policy = BackupPolicy(BackupWorkers(1))
    policy.ctx = types.SimpleNamespace(tracer=None)
    liveness = types.SimpleNamespace(stop=lambda: calls.append("stop"))
    reduction = types.SimpleNamespace(close=lambda: calls.append("reduction closed"))
    policy.parts = Parts([], None, "", None, 0, None, CatchUp(), liveness, reduction)
    policy.role = Role.LATE
    with pytest.raises(CommError, match="cannot cancel"):
        policy.apply(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    policy.close()
    # no drain (no new request on the aborted transport); the catch-up's thread is ended
    assert calls == ["receive", "stop", "reduction closed", "close"]


def test_a_step_on_a_device_stream_records_no_event_and_sync_records_one():
    """Where the host never waits for a group (a CUDA stream; here the stand-in's
    ``device_streams``), a step's completion only checks NCCL's asynchronous error: it
    records no event (an event per step was host time on every step of every collective).
    The host waits once, in sync(), on one event after everything enqueued."""
    nccl = FakeNccl()
    nccl.device_streams = True
    records = []
    record = nccl.stream.record
    nccl.stream.record = lambda: records.append(1) or record()
    t = _transport(nccl)
    pends = [t.exchange([(torch.ones(4), 1)], [(torch.zeros(4), 1)], 0) for _ in range(3)]
    assert all(p.wait_recv(0, time.monotonic() + 5) for p in pends) and records == []
    nccl.stream.run_all()
    assert t.sync(time.monotonic() + 5) and records == [1]
    nccl.error = RuntimeError("NCCL error: remote process exited")
    with pytest.raises(CommError, match="NCCL failed"):
        t.exchange([(torch.ones(4), 1)], [], 0).wait_send(0, time.monotonic() + 5)
    t.close()
