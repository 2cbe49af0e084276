"""The torch.distributed backend's CUDA path, with torch.cuda's calls replaced.

Current streams and the current device are per thread, and the group's
calls run on its call thread. Checked here with fakes that record which
thread did what: the call thread sets the group's device itself (once);
each call records an event on the *caller's* current stream when it is
made (a side stream included) and the call thread's stream waits on it
before the call runs; the NCCL communicator is made on the call thread,
on the first CUDA call's device, with the group's timeout, and the reduce
kernel is warmed then, on every size class a piece can have. The fakes
check commrt's logic around these calls, not CUDA; tests/gpu/test_gpu.py
runs the same path on a GPU.
"""

from __future__ import annotations

import datetime
import os
import threading
import types

import pytest
import torch
import torch.distributed as dist
from helpers.nccl_strict import MemoryStore, StrictNccl

from commrt.algorithms import Ring
from commrt.distributed import devices as D
from commrt.distributed import group as G
from commrt.distributed.devices import DeviceComms, Options
from commrt.schedule.executor import Executor
from commrt.schedule.position import Position
from commrt.transports import nccl_bootstrap
from commrt.transports.nccl import NcclTransport

CUDA3 = torch.device("cuda", 3)


class FakeStream:
    """A stream as an ordered list of what was enqueued on it: ("work", label), or
    ("wait", event)."""

    def __init__(self, name: str):
        self.name, self.ops = name, []

    def wait_event(self, event) -> None:
        self.ops.append(("wait", event))

    @property
    def waited(self) -> list:
        return [x for kind, x in self.ops if kind == "wait"]

    def after(self, upto: int | None = None) -> set:
        """The labels of the work that what is enqueued next on this stream runs after
        (the first ``upto`` entries only, if given): its own and, through waits, other
        streams'."""
        out: set = set()
        for kind, x in self.ops[:upto]:
            out |= {x} if kind == "work" else x.stream.after(x.at)
        return out


class FakeEvent:
    def __init__(self):
        self.stream, self.at = None, 0

    def record(self, stream) -> None:
        self.stream, self.at = stream, len(stream.ops)


class Cuda:
    """torch.cuda's per-thread state, faked: each thread's current stream (the default
    stream, which every thread shares, until the thread sets one), streams as lists of
    what was enqueued (:class:`FakeStream`), and a log of what ran where."""

    def __init__(self, monkeypatch):
        self.log: list[tuple] = []
        self.default = FakeStream("default")
        self.current: dict[str, FakeStream] = {}
        self.made = 0
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)
        monkeypatch.setattr(torch.cuda, "current_stream", self.current_stream)
        monkeypatch.setattr(torch.cuda, "set_stream", self.set_stream)
        monkeypatch.setattr(torch.cuda, "Stream", self.stream)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
        monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
        real = torch.futures.Future

        class Future(real):  # a CUDA future needs CUDA: the CPU one, and who waited on it
            def __init__(inner, devices=None):
                super().__init__()

            def wait(inner):
                self.log.append(("future.wait", threading.current_thread().name))
                return super().wait()

        monkeypatch.setattr(torch.futures, "Future", Future)

    def set_device(self, device) -> None:
        self.log.append(("set_device", threading.current_thread().name, device))

    def current_stream(self, device=None) -> FakeStream:
        return self.current.get(threading.current_thread().name, self.default)

    def set_stream(self, stream: FakeStream) -> None:
        self.current[threading.current_thread().name] = stream

    def stream(self, device=None) -> FakeStream:
        self.made += 1
        return FakeStream(f"stream{self.made}")

    def enqueue(self, label: str) -> None:
        """Work on the calling thread's current stream."""
        self.current_stream().ops.append(("work", label))


#: a communicator as the group's stats read it after a call: a world of one runs nothing
_POSITION = Position()
ALONE = types.SimpleNamespace(
    world_size=1,
    transport=types.SimpleNamespace(name="stand-in"),
    executor=types.SimpleNamespace(last_schedule=None, position=_POSITION),
    note_op=_POSITION.note_op,  # as Communicator.note_op
)


class Devices(DeviceComms):
    """DeviceComms without transports: a CPU context that is never used, and a CUDA one
    that records the thread it was made on."""

    def __init__(self, log, group_id: str = "fake"):
        self.rank, self.size, self.group_id, self.timeout = 0, 1, group_id, 30.0
        self.options, self.algorithm, self.tracer = Options(), Ring(), None
        self.lock, self.pick_lock = threading.Lock(), threading.Lock()
        self.cuda_device, self.log, self.one_core_each = None, log, False
        self.by_type = {"cpu": types.SimpleNamespace(algorithm=self.algorithm, comm=ALONE)}

    def _cuda(self, dtype):
        self.log.append(("make NCCL", threading.current_thread().name, dtype))
        return types.SimpleNamespace(algorithm=self.algorithm, device=self.cuda_device, comm=ALONE)

    def close(self) -> None:
        pass


def test_the_call_thread_sets_the_device_and_waits_for_the_callers_stream(monkeypatch):
    cuda = Cuda(monkeypatch)
    monkeypatch.setattr(
        G.ops,
        "allreduce",
        lambda dc, t, op: cuda.log.append(("run", threading.current_thread().name)),
    )
    pg = G.ProcessGroupCommrt(Devices(cuda.log))
    tensor = types.SimpleNamespace(device=CUDA3, dtype=torch.bfloat16, nbytes=2)
    try:
        pg.allreduce([tensor]).wait()
        side = cuda.current["MainThread"] = FakeStream("side")  # torch.cuda.stream(side)
        pg.allreduce([tensor]).wait()
    finally:
        pg.shutdown()
    call = "commrt-pg-fake"
    assert [e for e in cuda.log if e[0] != "future.wait"] == [
        ("set_device", call, CUDA3),  # on the call thread, before anything, and once
        ("make NCCL", call, torch.bfloat16),
        ("run", call),
        ("run", call),
    ]
    assert cuda.log.count(("future.wait", "MainThread")) == 2  # the caller's streams wait
    first, second = cuda.current[call].waited  # the call thread's stream waited, per call,
    assert first.stream is cuda.default and second.stream is side  # on the caller's


def test_a_call_runs_after_the_callers_work_before_it_and_not_after_later_work(monkeypatch):
    """The caller enqueues work, makes a call, and enqueues more work (the rest of its
    backward) before the call thread gets to the call. The call used to make its thread's
    current stream, the default stream every thread shares, wait for the caller's event:
    the collective then ran after everything on it, the later work included, and
    overlapped nothing. Now it runs on the group's own stream, after the caller's work
    up to the call only; and each group has a stream of its own."""
    cuda = Cuda(monkeypatch)
    gate, seen = threading.Event(), []

    def allreduce(dc, t, op):
        gate.wait(10)  # the call thread is busy until the caller has enqueued more
        stream = torch.cuda.current_stream()
        seen.append((threading.current_thread().name, stream, stream.after()))

    monkeypatch.setattr(G.ops, "allreduce", allreduce)
    groups = [G.ProcessGroupCommrt(Devices(cuda.log, name)) for name in ("a", "b")]
    tensor = types.SimpleNamespace(device=CUDA3, dtype=torch.float32, nbytes=4)
    try:
        busy = [pg.allreduce([tensor]) for pg in groups]
        cuda.enqueue("before")
        works = [pg.allreduce([tensor]) for pg in groups]
        cuda.enqueue("after")
        gate.set()
        for w in busy + works:
            w.wait()
    finally:
        for pg in groups:
            pg.shutdown()
    for name in ("commrt-pg-a", "commrt-pg-b"):
        first, second = [(stream, after) for who, stream, after in seen if who == name]
        assert first[0] is second[0] and first[1] == set() and second[1] == {"before"}
    streams = {id(stream) for _, stream, _ in seen}
    assert len(streams) == 2 and id(cuda.default) not in streams


def test_a_synchronous_call_runs_on_the_callers_thread_and_stream(monkeypatch):
    """``dist.all_reduce(t)`` of a CUDA tensor (``asyncOp`` False): the caller only waits,
    so the call runs on its thread, on the tensor's device for the call's length only,
    after the caller's own current stream (the transport orders itself after it): no
    call thread, no stream of the group's, no event. A call behind a queued one still
    waits its turn on the call thread."""
    cuda = Cuda(monkeypatch)
    entered = []

    class Device:  # torch.cuda.device(d), faked: which device, on which thread
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append((threading.current_thread().name, self.device))

        def __exit__(self, *exc):
            entered.append((threading.current_thread().name, None))

    monkeypatch.setattr(torch.cuda, "device", Device)

    def allreduce(dc, t, op):
        cuda.log.append(("run", threading.current_thread().name, torch.cuda.current_stream()))

    monkeypatch.setattr(G.ops, "allreduce", allreduce)
    pg = G.ProcessGroupCommrt(Devices(cuda.log))
    tensor = types.SimpleNamespace(device=CUDA3, dtype=torch.float32, nbytes=4)
    # torch's options as a synchronous dist.all_reduce passes them (asyncOp: torch 2.7+)
    opts = types.SimpleNamespace(reduceOp=dist.ReduceOp.SUM, asyncOp=False)
    try:
        side = cuda.current["MainThread"] = FakeStream("side")
        pg.allreduce([tensor], opts).wait()
    finally:
        pg.shutdown()
    runs = [e for e in cuda.log if e[0] != "future.wait"]
    assert runs == [("make NCCL", "MainThread", torch.float32), ("run", "MainThread", side)]
    assert entered == [("MainThread", CUDA3), ("MainThread", None)]
    assert side.ops == [] and cuda.made == 0  # no event waited on, no stream made


def test_a_bad_device_is_the_callers_error_at_the_call(monkeypatch):
    Cuda(monkeypatch)
    devices = Devices([])
    assert devices.check(CUDA3) == CUDA3 and devices.check(torch.device("cuda")) == CUDA3
    with pytest.raises(ValueError, match="on cuda:1, but this group's NCCL .* on cuda:3"):
        devices.check(torch.device("cuda", 1))
    with pytest.raises(NotImplementedError, match="no transport for meta tensors"):
        devices.check(torch.device("meta"))
    assert devices.check(torch.device("cpu")) is None


def test_nccl_gets_the_calls_device_and_the_groups_timeout_and_is_warmed(monkeypatch):
    got: dict = {}

    def init_nccl(rank, size, local_rank, device, nccl_module=None, **kw):
        got.update(device=device, timeout=kw["timeout"])
        nccl = StrictNccl(MemoryStore())
        return NcclTransport(0, 1, os.urandom(128), torch.device("cpu"), nccl=nccl, timeout=30)

    monkeypatch.setattr(nccl_bootstrap, "init_nccl", init_nccl)
    monkeypatch.setattr(D, "warm_kernels", lambda comm, dtypes: got.update(warmed=dtypes))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    timeout = datetime.timedelta(seconds=42)
    for dtype, options, warmed in (
        (torch.bfloat16, Options(), (torch.bfloat16,)),
        (torch.int64, Options(), (torch.float32,)),  # the kernels do not sum int64
        (torch.float16, Options(warm_dtypes=()), ()),
    ):
        devices = DeviceComms(dist.HashStore(), 0, 1, timeout, options, "0", [0])
        assert devices.check(torch.device("cuda")) == torch.device("cuda", 2)
        dc = devices.get(torch.device("cuda"), dtype)
        assert got == {"device": torch.device("cuda", 2), "timeout": 42.0, "warmed": warmed}
        assert dc.comm.timeout == 42.0
        devices.close()


def test_warming_covers_every_piece_size_class():
    """Every reduce a schedule runs on pieces of at most ``piece_bytes`` falls in a size
    class (bit length, the autotuner's key) that warming launched; nothing on the CPU."""
    piece_bytes = 4 * 1000
    sizes = D.warm_sizes(piece_bytes, torch.float32)
    assert sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    classes = {n.bit_length() for n in sizes}
    ex = Executor()
    for p in (2, 3, 5, 8):
        for numel in (1, 7, 999, 1000, 1001, 123_457):
            plan = ex.bindings.plan(Ring().schedule(p), 1, numel, piece_bytes // 4)
            reduced = {x.stop - x.start for st in plan.steps for x in st.recvs if x.reduce}
            assert {n.bit_length() for n in reduced if n} <= classes, (p, numel, reduced)
    cpu = types.SimpleNamespace(device=torch.device("cpu"), world_size=4)
    assert D.warm_kernels(cpu, (torch.float32,)) == 0
