"""The shared plumbing: the tag registry, the coalescing helper, the p2p exchange."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch
from helpers.local_transport import run_ranks

from commrt.collectives.coalesce import bounded_runs, coalesced
from commrt.errors import CommTimeoutError
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where


def test_tag_ranges_stay_apart():
    for (a, (a0, a1)), (b, (b0, b1)) in itertools.combinations(tags.RANGES.items(), 2):
        assert a1 <= b0 or b1 <= a0, f"{a} and {b} overlap"
    # the largest schedules the simulator runs (a ring at p = 65536) stay in the executor's range
    assert tags.executor(2 * 65536, tags.PIECE_TAGS - 1) < tags.EXECUTOR_END
    assert tags.shuffle(tags.SHUFFLE_EPOCHS + 3) == tags.shuffle(3)
    assert tags.RANGES["shuffle"][0] <= tags.shuffle(12345) < tags.RANGES["shuffle"][1]


@pytest.mark.parametrize(
    "sizes,limit,runs",
    [
        ([], 10, []),
        ([3, 3, 3, 3], 6, [[0, 1], [2, 3]]),
        ([20, 1, 1], 10, [[0], [1, 2]]),  # an item over the limit gets a run of its own
        ([1, 20, 1], 10, [[0], [1], [2]]),
        ([5, 5], 10, [[0, 1]]),
    ],
)
def test_bounded_runs(sizes, limit, runs):
    assert [list(r) for r in bounded_runs(sizes, limit)] == runs


def test_coalesced_groups_by_wire_dtype_in_bounded_buffers_and_copies_back():
    torch.manual_seed(0)
    tensors = [
        torch.randn(7, 3),
        torch.arange(5, dtype=torch.int32),
        torch.randn(11),
        torch.zeros(4, dtype=torch.bool),
        torch.randn(2, 2, dtype=torch.float64),
    ]
    before = [t.clone() for t in tensors]
    wire = {torch.bool: torch.int64}
    groups = list(coalesced(tensors, max_bytes=100, wire=lambda d: wire.get(d, d)))
    assert all(g.flat.numel() * g.flat.element_size() <= 100 or len(g.tensors) == 1 for g in groups)
    assert [str(g.flat.dtype) for g in groups] == sorted(str(g.flat.dtype) for g in groups)
    seen = [t for g in groups for t in g.tensors]
    assert sorted(map(id, seen)) == sorted(map(id, tensors))
    for g in groups:
        g.flat.add_(1)
        g.copy_back()
    for t, b in zip(tensors, before):
        expect = (b.to(torch.int64) + 1).to(b.dtype) if b.dtype == torch.bool else b + 1
        assert torch.equal(t, expect)


def _comm(tr, timeout=0.3):
    return Communicator(
        tr, Backend.GLOO, LaunchInfo("none", tr.rank, tr.world_size, 0, 1), timeout, 1 << 20
    )


def test_exchange_moves_bytes_and_names_the_silent_peer():
    def body(tr):
        comm = _comm(tr)
        peer = 1 - tr.rank
        got = torch.empty(4)
        ex = Exchange(
            comm,
            [(torch.full((4,), float(tr.rank)), peer)],
            [(got, peer)],
            tags.CATCHUP,
            Where("test"),
        )
        ex.complete()
        return got

    a, b = run_ranks(2, body)
    assert torch.equal(a, torch.ones(4)) and torch.equal(b, torch.zeros(4))

    def lonely(tr):
        comm = _comm(tr)
        if tr.rank == 0:
            ex = Exchange(
                comm,
                [],
                [(torch.empty(1), 1)],
                tags.shuffle(2),
                Where("shuffle", 2),
                hold_lock=True,
            )
            t0 = time.monotonic()
            with pytest.raises(CommTimeoutError) as err:
                ex.complete()
            assert time.monotonic() - t0 < 5
            assert not ex.holding and comm.lock.acquire(blocking=False)  # the lock came back
            return str(err.value)

    message = run_ranks(2, lonely)[0]
    assert "rank 0" in message and "from rank 1" in message and "shuffle, step 2" in message


def test_exchange_without_a_communicator_stands_on_its_transport():
    """A communicator's farewells are posted before it exists: an Exchange on a bare
    transport moves bytes, answers polls, and needs a deadline to wait."""
    with pytest.raises(ValueError, match="needs a transport"):
        Exchange(None, [], [], tags.FAREWELL, Where("farewell"))

    checked = threading.Event()  # rank 1 sends once rank 0 has seen nothing arrive

    def body(tr):
        peer = 1 - tr.rank
        got = torch.empty(3)
        ex = Exchange(None, [], [(got, peer)], tags.FAREWELL, Where("farewell"), transport=tr)
        if tr.rank == 0:
            assert not ex.recv_landed(0)  # polled once: rank 1 has not sent yet
            with pytest.raises(ValueError, match="needs a deadline"):
                ex.complete()
            with pytest.raises(CommTimeoutError, match="algorithm farewell"):
                ex.wait_recv(0, time.monotonic() + 0.05)
            checked.set()
        else:
            assert checked.wait(30)
        sends = [(torch.full((3,), float(tr.rank + 1)), peer)]
        Exchange(None, sends, [], tags.FAREWELL, Where("farewell"), transport=tr)
        assert ex.recv_landed(0, time.monotonic() + 5)
        return got

    a, b = run_ranks(2, body)
    assert torch.equal(a, torch.full((3,), 2.0)) and torch.equal(b, torch.ones(3))


def test_exchange_cancel_withdraws_what_is_pending_and_gives_the_lock_back():
    withdrawn = []

    def body(tr):
        comm = _comm(tr)
        ex = Exchange(comm, [], [(torch.empty(1), 1)], tags.CATCHUP, Where("t"), hold_lock=True)
        ex.pending.cancel = lambda: withdrawn.append(tr.rank)
        ex.cancel()
        assert not ex.holding and comm.lock.acquire(blocking=False)

    run_ranks(1, body)
    assert withdrawn == [0]
