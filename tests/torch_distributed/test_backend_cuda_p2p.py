"""The torch.distributed backend's CUDA send and receive, on communicators of their own.

Ranks are threads of this process, each with its own process group over one
in-memory store; their NCCL communicators are the strict stand-in's
(tests/helpers/nccl_strict.py) on the CPU, made through commrt's own
``init_nccl`` (patched only to hand it the stand-in and the CPU), and their
tensors are CPU tensors that call themselves ``cuda:3``, so the group takes
its CUDA path. The stand-in creates communicators collectively (a subset
hangs, and it names who is missing) and matches messages as NCCL does: per
peer, in the order they were issued, without tags. This checks commrt's
choice of communicators, not NCCL or CUDA.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist
from helpers.nccl_strict import MemoryStore, StrictNccl

from commrt.algorithms import Ring
from commrt.distributed import group as G
from commrt.distributed.devices import DeviceComms, Options
from commrt.transports import nccl_bootstrap

CUDA3 = torch.device("cuda", 3)
#: how long the stand-in's "forever" lasts: a creation a rank never joins fails after it
HANG_S = 3.0


class OnCuda(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:3``: the group routes it as a CUDA tensor,
    and the stand-in moves its bytes."""

    @property
    def device(self):
        return CUDA3


def on_cuda(t: torch.Tensor) -> OnCuda:
    return t.as_subclass(OnCuda)


class ThreadRank(DeviceComms):
    """One rank's DeviceComms: no CPU communicator (none of these calls use it), the
    CUDA ones made by the real code."""

    OPTIONS = Options()

    def __init__(self, store, rank: int, size: int):
        self.store, self.rank, self.size, self.group_id = store, rank, size, "threads"
        self.timeout, self.options, self.algorithm, self.tracer = 20.0, self.OPTIONS, Ring(), None
        self.global_ranks = [100 + r for r in range(size)]  # no stall watch for a sub-group
        self.one_core_each = False
        self.lock, self.pick_lock = threading.Lock(), threading.Lock()
        self.cuda_device, self.pairs, self.pair_locks = None, {}, {}
        self.by_type = {}


@pytest.fixture
def cuda(monkeypatch):
    """torch.cuda's calls on the group's path made harmless, and init_nccl handing the
    stand-in (one per communicator, over one shared store) and the CPU to the real one."""
    monkeypatch.setenv("COMMRT_ABORT_ON_ERROR", "0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: _Nothing())
    monkeypatch.setattr(torch.cuda, "Event", _Nothing)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Nothing())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Nothing())
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: None)
    monkeypatch.setattr(torch.futures, "Future", _CpuFuture)
    real, shared = nccl_bootstrap.init_nccl, MemoryStore()
    made: list = []

    def init_nccl(rank, size, local_rank, device, nccl_module=None, **kw):
        nccl = StrictNccl(shared, hang_s=HANG_S)
        made.append((threading.current_thread().name, size, nccl))
        return real(rank, size, local_rank, torch.device("cpu"), nccl, **kw)

    monkeypatch.setattr(nccl_bootstrap, "init_nccl", init_nccl)
    return made


class _Nothing:
    """A stream, an event or a device context that does nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def record(self, stream=None):
        pass

    def wait_event(self, event):
        pass


class _CpuFuture(torch.futures.Future):
    """A CUDA future's calls on a CPU one."""

    def __init__(self, devices=None):
        super().__init__()


def ranks(n: int, bodies, limit: float = 30.0) -> list:
    """Run ``bodies[r](pg)`` for each rank r on a thread of its own; the results (errors
    raised here)."""
    store = dist.HashStore()
    out: list = [None] * n

    def run(r):
        pg = G.ProcessGroupCommrt(ThreadRank(store, r, n))
        try:
            out[r] = bodies[r](pg)
        except BaseException as e:  # noqa: BLE001 - raised below
            out[r] = e
        finally:
            pg.shutdown()

    threads = [threading.Thread(target=run, args=(r,), name=f"rank{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit)
    assert not any(t.is_alive() for t in threads), "a rank still runs"
    for got in out:
        if isinstance(got, BaseException):
            raise got
    return out


def test_a_send_before_any_collective_makes_only_the_pairs_communicator(cuda):
    """Ranks 0 and 2 of three exchange before any collective. The first CUDA send used to
    make the group's communicator, which rank 1 never joins: both waited until the
    timeout (here the stand-in's hang, naming rank 1). Now a 2-rank communicator of just
    the pair is made, on the callers' threads, and the data arrives."""
    x = torch.arange(5, dtype=torch.float32)
    got = torch.zeros(5)

    def send(pg):
        pg.send([on_cuda(x)], 2).wait()

    def recv(pg):
        pg.recv([on_cuda(got)], 0).wait()

    ranks(3, [send, lambda pg: None, recv])
    assert torch.equal(got, x)
    assert sorted((who, size) for who, size, _ in cuda) == [("rank0", 2), ("rank2", 2)]


def test_a_send_issued_between_collectives_never_lands_in_a_collectives_receive(cuda, monkeypatch):
    """NCCL matches per peer in issue order, without tags. Rank 0 issues an all-reduce (on
    its call thread) and then, on its own thread, a send; rank 1 receives first and
    all-reduces after. On one communicator rank 1's receive took rank 0's all-reduce
    message (here a count mismatch; with equal counts, silently wrong data). On the
    pair's own communicator each message lands where it belongs."""
    launched = threading.Event()

    def allreduce(dc, t, op):  # the group's NCCL all-reduce, on its call thread
        transport = dc.comm.transport
        args = (transport.nccl, len(transport.nccl.launched), launched)
        threading.Thread(target=_when_launched, args=args).start()
        transport.native_all_reduce(t.as_subclass(torch.Tensor))

    monkeypatch.setattr(G.ops, "allreduce", allreduce)
    x, got = torch.arange(5, dtype=torch.float32) + 1, torch.zeros(5)
    sums = [torch.full((3,), 1.0), torch.full((3,), 2.0)]

    def rank0(pg):
        pg.allreduce([on_cuda(torch.ones(1))]).wait()  # the group's communicator exists
        launched.clear()
        work = pg.allreduce([on_cuda(sums[0])])
        assert launched.wait(20), "rank 0's all-reduce was never issued"
        pg.send([on_cuda(x)], 1).wait()
        work.wait()

    def rank1(pg):
        pg.allreduce([on_cuda(torch.ones(1))]).wait()
        pg.recv([on_cuda(got)], 0).wait()
        pg.allreduce([on_cuda(sums[1])]).wait()

    ranks(2, [rank0, rank1])
    assert torch.equal(got, x)
    assert all(torch.equal(s, torch.full((3,), 3.0)) for s in sums)


def _when_launched(nccl: StrictNccl, before: int, flag: threading.Event) -> None:
    deadline = time.monotonic() + 20
    while len(nccl.launched) == before and time.monotonic() < deadline:
        time.sleep(1e-3)
    flag.set()


def test_a_peer_that_is_no_other_rank_is_refused_by_name(cuda):
    def bad(pg):
        for peer in (0, 2, -1):
            with pytest.raises(ValueError, match=f"cannot send to or receive from rank {peer}"):
                pg.send([on_cuda(torch.zeros(1))], peer)

    store = dist.HashStore()
    pg = G.ProcessGroupCommrt(ThreadRank(store, 0, 2))
    try:
        bad(pg)
    finally:
        pg.shutdown()


def _ring(pg, rank: int, n: int, got: list) -> None:
    """Rank ``rank`` sends to the next rank before it receives from the one before."""
    pg.allreduce([on_cuda(torch.ones(1))]).wait()  # the group's CUDA communicator
    x = torch.full((3,), float(rank))
    into = torch.zeros(3)
    sent = pg.send([on_cuda(x)], (rank + 1) % n)
    pg.recv([on_cuda(into)], (rank - 1) % n).wait()
    sent.wait()
    got[rank] = into


@pytest.fixture
def native(monkeypatch):
    """The group's all-reduce as its NCCL transport's own (the stand-in's CPU buffers)."""
    monkeypatch.setattr(G.ops, "allreduce", lambda dc, t, op: dc.comm.transport.native_all_reduce(
        t.as_subclass(torch.Tensor)))  # fmt: skip


def test_a_ring_of_sends_before_receives_finds_every_pair_made(cuda, native):
    """Four ranks: each sends to rank r + 1 before it receives from r - 1. Pairs made at
    first use waited round the ring (rank r for r + 1, which waits for r + 2...) until the
    stand-in's hang; made with the group's communicator, in one order on every rank, they
    are all there and connected, and each rank gets its predecessor's tensor."""
    n, got = 4, [None] * 4
    ranks(n, [lambda pg, r=r: _ring(pg, r, n, got) for r in range(n)])
    for r in range(n):
        assert torch.equal(got[r], torch.full((3,), float((r - 1) % n))), got
    pairs = sorted(size for _, size, _ in cuda if size == 2)
    assert len(pairs) == n * (n - 1), cuda  # every rank made its three pairs


@pytest.mark.slow
def test_pairs_made_at_first_use_wait_round_a_ring(cuda, native, monkeypatch):
    """The same ring with ``eager_pairs=0`` (pairs made at first use, as for groups larger
    than ``eager_pairs``): it does not finish (its ranks end later, at their timeouts)."""
    monkeypatch.setattr(ThreadRank, "OPTIONS", Options(eager_pairs=0))
    n, got = 4, [None] * 4
    with pytest.raises(AssertionError, match="a rank still runs"):
        ranks(n, [lambda pg, r=r: _ring(pg, r, n, got) for r in range(n)], limit=8)
    assert got == [None] * n
