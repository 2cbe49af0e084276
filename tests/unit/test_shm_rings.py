"""The shared-memory transport's rings, matching and refusals, in one process.

Ranks are threads here, each with its own ShmTransport over the same files
(as processes would map them); the multi-process tests in
``tests/multiprocess/test_shm_transport.py`` add real processes, deaths and
collectives.
"""

import dataclasses
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
from helpers.local_transport import on_threads

from commrt.transports import shm, shm_connect
from commrt.transports.shm_connect import connect


def _ranks(n, fn, ring_bytes=None, monkeypatch=None):
    """Run ``fn(transport)`` on ``n`` connected transports, one thread each; return results."""
    if ring_bytes is not None:
        monkeypatch.setattr(shm_connect, "RING_BYTES", ring_bytes)
        monkeypatch.setattr(shm_connect, "MIN_RING_BYTES", min(ring_bytes, 1024))
    store = dist.HashStore()

    def run(rank):
        t = connect(store, rank, n, 30)
        if isinstance(t, str):
            return t
        try:
            return fn(t)
        finally:
            t.close()

    return on_threads(n, run)


def _pattern(src, dst, n):
    g = torch.Generator().manual_seed(1000 * src + 10 * dst + n)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def _all_pairs(sizes):
    def fn(t):
        deadline = time.monotonic() + 20
        peers = [r for r in range(t.world_size) if r != t.rank]
        for n in sizes:
            got = {p: torch.empty(n, dtype=torch.uint8) for p in peers}
            sends = [(_pattern(t.rank, p, n), p) for p in peers]
            pend = t.exchange(sends, [(got[p], p) for p in peers], tag=n % 97)
            for i in range(len(peers)):
                assert pend.wait_recv(i, deadline) and pend.wait_send(i, deadline)
            for p in peers:
                assert torch.equal(got[p], _pattern(p, t.rank, n)), (t.rank, p, n)
        return True

    return fn


@pytest.mark.parametrize("ring_bytes", [1 << 20, 4096])
def test_every_size_arrives_whole_between_every_pair(ring_bytes, monkeypatch):
    # sizes around the 16-byte padding, a header at the ring's end, and messages many
    # times the ring (4 KiB rings: every message but the smallest wraps)
    sizes = [0, 1, 15, 16, 17, 4095, 4096, 4097, 11048, 3 << 20]
    assert _ranks(3, _all_pairs(sizes), ring_bytes, monkeypatch) == [True] * 3


def test_messages_are_matched_by_tag_in_order_when_received_out_of_order(monkeypatch):
    # rank 0 sends tag 7 twice, then tag 8 (larger than the ring); rank 1 asks for tag 8
    # first: the tag-7 messages are read aside and matched later, first in first out
    def fn(t):
        deadline = time.monotonic() + 20
        if t.rank == 0:
            msgs = [(torch.full((10,), 1.0), 7), (torch.full((10,), 2.0), 7)]
            msgs.append((torch.full((5000,), 3.0), 8))
            pends = [t.exchange([(x, 1)], [], tag) for x, tag in msgs]
            return all(p.wait_send(0, deadline) for p in pends)
        big, a, b = torch.empty(5000), torch.empty(10), torch.empty(10)
        assert t.exchange([], [(big, 0)], 8).wait_recv(0, deadline)
        pa, pb = t.exchange([], [(a, 0)], 7), t.exchange([], [(b, 0)], 7)
        assert pa.wait_recv(0, deadline) and pb.wait_recv(0, deadline)
        return (big == 3).all().item() and (a == 1).all().item() and (b == 2).all().item()

    assert _ranks(2, fn, 4096, monkeypatch) == [True, True]


def test_native_all_reduce_is_the_same_to_the_bit_everywhere():
    def fn(t):
        x = torch.randn(1000, generator=torch.Generator().manual_seed(t.rank))
        t.native_all_reduce(x)
        return x

    out = _ranks(3, fn)
    want = sum(torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(3))
    for x in out:
        assert torch.equal(x, out[0])
    torch.testing.assert_close(out[0], want)


def test_bfloat16_and_bool_travel_as_bytes():
    def fn(t):
        peer, deadline = 1 - t.rank, time.monotonic() + 20
        bf, flags = (
            torch.full((7,), 1.5 + t.rank, dtype=torch.bfloat16),
            torch.tensor([t.rank == 0]),
        )
        gbf, gflags = torch.empty(7, dtype=torch.bfloat16), torch.empty(1, dtype=torch.bool)
        pend = t.exchange([(bf, peer), (flags, peer)], [(gbf, peer), (gflags, peer)], 3)
        assert pend.wait_recv(0, deadline) and pend.wait_recv(1, deadline)
        return gbf[0].item(), gflags.item()

    assert _ranks(2, fn) == [(2.5, False), (1.5, True)]


def test_a_larger_message_than_posted_is_named_as_truncated():
    def fn(t):
        deadline = time.monotonic() + 5
        if t.rank == 0:
            t.exchange([(torch.zeros(100, dtype=torch.uint8), 1)], [], 4).wait_send(0, deadline)
            return None
        with pytest.raises(RuntimeError, match="truncated: rank 0 sent 100 bytes .* 50 were"):
            t.exchange([], [(torch.empty(50, dtype=torch.uint8), 0)], 4).wait_recv(0, deadline)
        with pytest.raises(RuntimeError, match="truncated"):  # the stream is broken now
            t.barrier(1)
        return "refused"

    assert _ranks(2, fn)[1] == "refused"


def test_a_wait_ends_false_at_its_deadline_and_a_withdrawn_receive_is_never_filled():
    def fn(t):
        if t.rank == 1:
            early = torch.zeros(4)
            pend = t.exchange([], [(early, 0)], 9)
            t0 = time.monotonic()
            assert pend.wait_recv(0, t0 + 0.2) is False
            assert 0.15 < time.monotonic() - t0 < 5
            pend.cancel()
        t.barrier(10)
        if t.rank == 0:
            t.exchange([(torch.ones(4), 1)], [], 9).wait_send(0, time.monotonic() + 10)
            return True
        late = torch.zeros(4)
        assert t.exchange([], [(late, 0)], 9).wait_recv(0, time.monotonic() + 10)
        return bool((late == 1).all()) and bool((early == 0).all())

    assert _ranks(2, fn) == [True, True]


def test_the_files_are_gone_once_every_rank_mapped_them(monkeypatch):
    # a token of this test's own: other jobs on the machine have commrt files of theirs
    token = "0123456789abcdef"
    monkeypatch.setattr(shm_connect.secrets, "token_hex", lambda n: token)
    ours = lambda: [n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"commrt-{token}-")]  # noqa: E731
    assert _ranks(2, lambda t: t.rank) == [0, 1]
    time.sleep(0.1)
    assert not ours()


def test_every_rank_gets_the_same_reason_when_one_cannot_share_memory(monkeypatch):
    real, calls = shm_connect.unusable, []

    def unusable():
        calls.append(threading.get_ident())
        return "pretend: this rank is elsewhere" if len(calls) == 2 else real()

    monkeypatch.setattr(shm_connect, "unusable", unusable)
    out = _ranks(3, lambda t: "connected")
    assert len(set(out)) == 1 and out[0].startswith("rank "), out
    assert "pretend: this rank is elsewhere" in out[0] or "not in this" in out[0], out


def test_other_architectures_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(shm_connect.platform, "machine", lambda: "aarch64")
    why = shm_connect.unusable()
    assert "x86-64" in why and "aarch64" in why


def test_no_room_in_dev_shm_shrinks_the_rings_then_refuses(monkeypatch):
    class Stat:
        f_frsize = 4096

        def __init__(self, free):
            self.f_bavail = free // 4096

    monkeypatch.setattr(shm_connect.os, "statvfs", lambda _: Stat(64 << 20))
    assert shm_connect.ring_size(8) == 512 << 10  # 56 rings in half of 64 MiB
    monkeypatch.setattr(shm_connect.os, "statvfs", lambda _: Stat(1 << 20))
    assert shm_connect.ring_size(8) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_a_receive_that_adds_sums_in_its_dtype_across_the_ring_end_and_aside(dtype, monkeypatch):
    # 4 KiB rings: 3000 elements wrap many times; the second message arrives before its
    # receive is posted (read aside), and is added in when it is
    n = 3000

    def values(rank, k):
        g = torch.Generator().manual_seed(10 * rank + k)
        return (torch.randn(n, generator=g) * 1000).to(dtype)

    def fn(t):
        peer, deadline = 1 - t.rank, time.monotonic() + 20
        mine, late = values(t.rank, 0), values(t.rank, 1)
        acc, acc_late = values(t.rank, 2), values(t.rank, 3)
        pend = t.exchange([(mine, peer), (late, peer)], [(acc, peer)], 5, adds=(True,))
        assert pend.wait_recv(0, deadline) and pend.wait_send(1, deadline)
        t.barrier(10)  # the peer's late message is in this rank's ring or aside by now
        aside = t.exchange([], [(acc_late, peer)], 5, adds=(True,))
        assert aside.wait_recv(0, deadline)
        return (
            torch.equal(acc, values(t.rank, 2) + values(peer, 0)),
            torch.equal(acc_late, values(t.rank, 3) + values(peer, 1)),
        )

    assert _ranks(2, fn, 4096, monkeypatch) == [(True, True)] * 2


def test_the_executor_adds_on_receive_and_rounds_as_with_a_scratch_buffer():
    # the same schedules on shared memory (receives add in place) and on the same ranks
    # with adding turned off (scratch + add): equal to the bit, and adding was used
    import commrt.algorithms as algs
    from commrt.schedule.executor import Executor

    def fn(t):
        used = []
        real = t.prepare_adding
        t.prepare_adding = lambda *a: used.append(a[2]) or real(*a)
        out = []
        for adding in (True, False):
            t.traits = dataclasses.replace(t.traits, adds_on_receive=adding)
            ex = Executor()
            for alg in (algs.Ring(), algs.HalvingDoubling(), algs.Torus2D(rows=2, cols=2)):
                x = torch.randn(10_001, generator=torch.Generator().manual_seed(t.rank))
                ex.run(alg.schedule(4), x, t, timeout=30, piece_bytes=4096)
                out.append(x)
        return used, out

    results = _ranks(4, fn)
    for used, out in results:
        assert used and all(any(a) for a in used)
        for a, b in zip(out[:3], out[3:]):
            assert torch.equal(a, b)
    want = sum(torch.randn(10_001, generator=torch.Generator().manual_seed(r)) for r in range(4))
    torch.testing.assert_close(results[0][1][0], want, rtol=1e-5, atol=1e-5)


def test_a_wait_whose_transfer_moves_keeps_yielding_instead_of_sleeping(monkeypatch):
    # the clock advances 1 ms a poll: without moving() the wait would sleep after 5 ms
    from commrt.transports import base

    clock, slept, polls = [0.0], [], [0]
    monkeypatch.setattr(base.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(base.time, "sleep", lambda s: slept.append(s))
    monkeypatch.setattr(base.os, "sched_yield", lambda: None)

    def done():
        clock[0] += 1e-3
        polls[0] += 1
        return polls[0] > 50

    assert base.poll_until(done, 100.0, moving=lambda: True)
    assert slept == []
    polls[0] = 0
    assert base.poll_until(done, 100.0, moving=lambda: False)
    assert len(slept) > 40


def test_a_world_of_one_needs_no_files_and_reduces_to_itself():
    t = connect(dist.HashStore(), 0, 1, 30)
    x = torch.arange(5.0)
    t.native_all_reduce(x, op="avg")
    assert torch.equal(x, torch.arange(5.0)) and t.barrier(1)
    t.close()


def _connected_pair(ring_bytes, monkeypatch):
    """Two connected transports, ranks 0 and 1, for one thread to drive in turn."""
    monkeypatch.setattr(shm_connect, "RING_BYTES", ring_bytes)
    monkeypatch.setattr(shm_connect, "MIN_RING_BYTES", min(ring_bytes, 1024))
    store = dist.HashStore()
    return on_threads(2, lambda rank: connect(store, rank, 2, 30))


def test_a_poll_takes_the_lock_only_when_something_can_move(monkeypatch):
    a, b = _connected_pair(4096, monkeypatch)
    try:
        assert a._quiet() and b._quiet()  # nothing sent, nothing queued
        data, got = _pattern(0, 1, 10_000), torch.empty(10_000, dtype=torch.uint8)
        send = a.exchange([(data, 1)], [], tag=3)  # fills a's ring to b; the rest stays queued
        assert a._quiet()  # b has read nothing yet: no room, nothing to push
        assert not b._quiet()  # bytes wait in b's ring
        recv = b.exchange([], [(got, 0)], tag=3)  # b reads what is there: room for a
        assert b._quiet() and not a._quiet()
        deadline = time.monotonic() + 10
        while True:  # one thread drives both ranks: each wait returns at once
            sent, landed = send.wait_send(0, 0.0), recv.wait_recv(0, 0.0)
            if sent and landed:
                break
            assert time.monotonic() < deadline
        assert torch.equal(got, data) and a._quiet() and b._quiet()
    finally:
        a.close()
        b.close()


def test_a_long_wait_polls_without_progressing(monkeypatch):
    # rank 1 waits 0.2 s for a message that never comes: its polls read counters, and only
    # the first looks (the exchange's own progress aside) go through a progress
    a, b = _connected_pair(4096, monkeypatch)
    progressed = [0]
    real = type(b)._progress

    def counting(self):
        progressed[0] += 1
        return real(self)

    monkeypatch.setattr(type(b), "_progress", counting)
    try:
        pend = b.exchange([], [(torch.empty(4), 0)], tag=5)
        progressed[0] = 0
        assert pend.wait_recv(0, time.monotonic() + 0.2) is False
        assert progressed[0] <= 2, progressed[0]
        pend.cancel()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("adding", [True, False])
def test_a_small_prepared_step_started_again_and_again_lands_every_time(dtype, adding, monkeypatch):
    # 7 elements a message: its frames do not divide the 4 KiB ring, so over 300 starts
    # some messages wrap (read piece by piece) and the rest are read whole at once
    a, b = _connected_pair(4096, monkeypatch)

    def values(rank, k):
        g = torch.Generator().manual_seed(1000 * rank + k)
        return (torch.randn(7, generator=g) * 1000).to(dtype)

    try:
        sent = {r: torch.zeros(7, dtype=dtype) for r in (0, 1)}
        got = {r: torch.zeros(7, dtype=dtype) for r in (0, 1)}
        steps = [
            t.prepare_adding(
                [(sent[t.rank], 1 - t.rank)], [(got[t.rank], 1 - t.rank)], (adding,), 9
            )
            for t in (a, b)
        ]
        deadline = time.monotonic() + 20
        for k in range(300):
            for r in (0, 1):
                sent[r].copy_(values(r, k))
                got[r].copy_(values(r, k + 500))
            pends = [step.start(0.0) for step in steps]  # each pushes before either waits
            for pend in pends:
                assert pend.wait_recv(0, deadline) and pend.wait_send(0, deadline)
            for r in (0, 1):
                want = values(1 - r, k) + (values(r, k + 500) if adding else 0)
                assert torch.equal(got[r], want), (r, k)
    finally:
        a.close()
        b.close()
