"""Backup workers' liveness: one checked neighbour per rank, deaths recorded in the store.

Threads in this process stand for ranks; each has its own connections to one
real TCPStore, as ranks do. The checks: the store work per heartbeat period
is O(p) for the whole job (counted, not timed); a stopped rank is recorded
dead and every other rank sees it; a dead checker's neighbour is still found;
a rank that closed (said bye) is not called dead; a rank that was only slow
finds out it was declared dead and raises. Also close() after a SIGKILL on 4
real gloo ranks returns without waiting long for the dead rank.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from helpers.mp import gloo_ranks

from commrt.algorithms import BackupWorkers
from commrt.runtime.store import ControlStore, Host, host_store
from commrt.sync.backup.keys import Keys
from commrt.sync.backup.liveness import (
    Liveness,
    NeighbourBeats,
    RankDeclaredDeadError,
    beat_period,
    next_checked,
    quiet_reads_needed,
)
from commrt.transports.base import Traits

DEAD_AFTER_S = BackupWorkers().dead_after_s  # the default: tests run with it
#: generous bound on any wait below (a loaded 2-core machine), far above the expected seconds
HANG_S = 60.0


class Counting:
    """A store client that counts the operations made through it."""

    def __init__(self, inner, counts: list):
        self.inner, self.counts = inner, counts

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def counted(*a, **k):
            self.counts.append(name)
            return fn(*a, **k)

        return counted


class CountingStore:
    """A ControlStore whose clients count their operations in ``counts``."""

    def __init__(self, cs: ControlStore):
        self.cs, self.counts = cs, []

    def client(self, space):
        return Counting(self.cs.client(space), self.counts)


@pytest.fixture
def store():
    server = host_store()
    cs = ControlStore("127.0.0.1", server.port, Host.LAUNCHER, 30.0)
    yield cs
    del server


def ranks(cs, p, space="t", dead_after_s=DEAD_AFTER_S, counters=None, timeout=30.0):
    """``p`` Liveness objects on one store; with ``counters`` (a list), each rank's thread
    counts its store operations in a CountingStore appended there."""
    out = []
    for r in range(p):
        c = cs
        if counters is not None:
            c = CountingStore(cs)
            counters.append(c)
        out.append(Liveness(c, space, cs.client(space), r, p, dead_after_s, timeout))
    return out


def wait_until(cond, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > HANG_S:
            raise AssertionError(f"not within {HANG_S} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def test_ring_order_and_silence_rules():
    assert next_checked(1, 4, set()) == 2 and next_checked(3, 4, set()) == 0
    assert next_checked(1, 4, {2, 3}) == 0 and next_checked(0, 3, {1, 2}) is None
    # 8 beats before a rank can be called dead, and half of them read by the checker itself
    assert beat_period(2.0) == 0.25 and beat_period(0.8) == 0.1
    assert quiet_reads_needed(2.0) == 4 and quiet_reads_needed(0.1) == 4
    w = NeighbourBeats(5, now=0.0)
    w.saw(7, 0.0)
    w.saw(7, 3.0)  # the checker itself slept 3 s: one read is not enough to blame rank 5
    assert not w.silent(3.0, 2.0, 4)
    for t in (3.25, 3.5, 3.75):
        w.saw(7, t)
    assert w.silent(3.75, 2.0, 4)
    w.saw(8, 4.0)  # it beat again: alive
    assert not w.silent(4.0, 2.0, 4)


@pytest.mark.parametrize("p", [4, 16])
def test_store_work_per_period_is_three_operations_per_rank(store, p):
    """O(p) per period for the whole job: each rank beats, reads the death counter and
    reads one neighbour, whatever p is (before: p + 1 operations per rank)."""
    counters: list[CountingStore] = []
    live = ranks(store, p, f"ops{p}", counters=counters)
    for lv in live:
        lv.start()
    time.sleep(8 * beat_period(DEAD_AFTER_S))
    for lv in live:
        lv.stop()
    for r, (lv, counter) in enumerate(zip(live, counters)):
        ops = counter.counts
        beats = ops.count("add") // 3  # beat, death counter, neighbour: three adds
        assert beats >= 2, (r, ops)
        assert set(ops) == {"add"} and len(ops) == 3 * beats, (r, ops)
        assert lv.missing == frozenset(), (r, lv.missing)


@pytest.mark.slow
def test_a_stopped_rank_is_recorded_dead_and_everyone_sees_it(store):
    live = ranks(store, 6, "dead")
    for lv in live:
        lv.start()
    live[3].stop()  # silent from now on, never said bye
    others = [lv for r, lv in enumerate(live) if r != 3]
    took = wait_until(lambda: all(lv.missing == {3} for lv in others), "everyone sees 3 dead")
    checker = live[0].store.get(Keys.dead(3)).decode()
    assert checker == "2", checker  # its ring neighbour found it
    # then rank 2 checks rank 4: kill both, rank 1 finds 2 and then 4 (a checker's death)
    live[2].stop()
    live[4].stop()
    wait_until(lambda: live[0].missing == {2, 3, 4}, "a dead checker's neighbour is found")
    assert live[0].store.get(Keys.dead(4)).decode() == "1"
    assert int(live[0].store.add(Keys.DEATHS, 0)) == 3  # each death recorded once
    for lv in live:
        lv.stop()
    assert took > DEAD_AFTER_S * 0.9, took  # nobody is called dead before dead_after_s


def test_a_rank_still_setting_up_gets_the_timeout_not_dead_after_s(store):
    live = ranks(store, 3, "setup", dead_after_s=0.5, timeout=4.0)
    live[0].start()
    live[1].start()  # rank 2 never starts: it has not beaten once
    time.sleep(3 * 0.5)
    assert live[0].missing == frozenset() and not live[0].store.check([Keys.dead(2)])
    wait_until(lambda: live[0].missing == {2}, "rank 2 recorded dead after the timeout")
    live[0].stop()
    live[1].stop()


def test_a_rank_that_said_bye_is_gone_not_dead(store):
    live = ranks(store, 3, "bye")
    for lv in live:
        lv.start()
    live[1].stop()
    live[1].say_bye()
    wait_until(lambda: 1 in live[0].gone, "rank 0 finds rank 1 gone")
    assert live[0].missing == frozenset() and live[2].missing == frozenset()
    assert not live[0].store.check([Keys.dead(1)])
    for lv in live:
        lv.stop()


def test_a_rank_that_was_only_slow_finds_out_it_was_declared_dead(store):
    live = ranks(store, 3, "slow")
    for lv in live:
        lv.start()
    live[2].check_alive()  # alive: no error
    live[2].stop()  # as if the process were paused
    wait_until(lambda: live[0].missing == {2}, "rank 2 recorded dead")
    with pytest.raises(RankDeclaredDeadError, match="rank 2 was declared dead by rank 1") as e:
        live[2].check_alive()
    assert e.value.declared_by == e.value.watcher == 1  # watcher: the name it had before
    live[0].check_alive()  # the others go on
    for lv in live:
        lv.stop()


# ------------------------------------------------- close() after a SIGKILL (real ranks)
@pytest.mark.slow
def test_close_after_a_kill_does_not_wait_long_for_the_dead_rank(tmp_path):
    """4 gloo ranks, b = 1, the default dead_after_s; rank 3 SIGKILLs itself and the others
    close right away. Their close() returns once rank 3 is recorded dead (about
    dead_after_s after the kill), not after the communicator's timeout; the bound is a
    generous hang bound, not a speed claim."""
    codes, outs = gloo_ranks(4, "backup_worker.py", "gloo", "killclose", tmp_path, 1, timeout=120)
    assert codes[:3] == [0, 0, 0] and codes[3] == -9, (codes, "\n".join(outs))
    died = float((tmp_path / "died_at.txt").read_text())
    recs = [json.loads((tmp_path / f"killclose_rank{r}.json").read_text()) for r in range(3)]
    for r in recs:
        assert "error" not in r, r
        assert r["missing"] == [3] and r["global_step"] == r["final"], r
        assert r["close_ended"] - died < DEAD_AFTER_S + 3.0, (r["close_ended"] - died, r)


@pytest.mark.slow
def test_a_paused_rank_is_declared_dead_and_stops_with_a_clear_error(tmp_path):
    """Rank 3 stops (SIGSTOP) for PAUSE_S > dead_after_s. The others record it dead, finish
    and close without it; when it wakes, its next step raises RankDeclaredDeadError (before
    taking a ticket), and it exits cleanly."""
    codes, outs = gloo_ranks(4, "backup_worker.py", "gloo", "paused", tmp_path, 1, timeout=120)
    assert codes == [0, 0, 0, 0], (codes, "\n".join(outs))
    recs = [json.loads((tmp_path / f"paused_rank{r}.json").read_text()) for r in range(4)]
    for r in recs[:3]:
        assert "error" not in r, r
        assert r["missing"] == [3] and r["global_step"] == r["final"], r
    woke = recs[3]
    assert woke["error_type"] == "RankDeclaredDeadError", woke
    assert "rank 3 was declared dead by rank 2" in woke["error"], woke
    assert woke["global_step"] < recs[0]["final"], woke  # it never took part again


def test_a_late_rank_asks_again_when_its_catch_up_server_is_recorded_dead(monkeypatch):
    """A server killed before its send began: gloo did not always report it, and the late
    rank waited out the whole timeout (tools/chaos_backup.py, 2 trials of 20). Now the wait
    ends within a check period of the server being recorded dead, and the request goes out
    again."""
    from commrt.sync.backup import catchup as C

    class Pending:
        def wait_recv(self, i, deadline):
            time.sleep(max(0.0, min(0.01, deadline - time.monotonic())))
            return False  # the snapshot never comes

    class Exchange:  # on a transport whose waits may be sliced (gloo's: test_backup_waits.py)
        recvs, pending = [None], Pending()

        def wait_recv(self, i, deadline):
            raise AssertionError("waited out the timeout")

    class Store:
        def check(self, keys):
            return keys == [Keys.dead(3)]

    late = C.CatchUp.__new__(C.CatchUp)
    late.store = Store()
    t0 = time.monotonic()
    with pytest.raises(C.ServerDied, match="rank 3 was recorded dead"):
        C.ServerWaits(late.store, (3, 0), None, False).take(Exchange(), time.monotonic() + 30)
    assert time.monotonic() - t0 < 2 * C.CHECK_S + 0.5

    # receive() treats it as a lost server: asks again, and the next answer is taken
    answers = iter([C.ServerDied("gone"), {"server": 1, "step": 7}])
    asked = []

    def fake_receive(req, step, optimizer):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    class Transport:
        traits = Traits()

    class Comm:
        transport = Transport()

    late.comm, late.p, late._rbuf, late._lost = Comm(), 4, None, []
    monkeypatch.setattr(late, "_receive", fake_receive)
    monkeypatch.setattr(late, "request", lambda step: asked.append(step) or 99)
    assert late.receive(5, 6, None) == {"server": 1, "step": 7} and asked == [6]


def test_a_request_claimed_by_a_rank_that_died_before_answering_is_asked_again():
    """The claimer dies between its claim and its response: nobody else would answer, and
    the late rank waited out the timeout (tools/chaos_backup.py). The claim names its rank
    now, so the late rank sees that rank recorded dead and asks again."""
    from commrt.sync.backup import catchup as C

    class Store:
        def __init__(self):
            self.keys = {Keys.claim(5): b"2 0"}  # rank 2, its first incarnation

        def check(self, keys):
            return all(k in self.keys for k in keys)

        def get(self, key):
            return self.keys[key]

    late = C.CatchUp.__new__(C.CatchUp)
    late.store, late._next_claim_check = Store(), 0.0
    assert late._answered(5) is False  # claimed by rank 2, alive: keep waiting
    late.store.keys[Keys.dead(2)] = b"1"
    late._next_claim_check = 0.0
    with pytest.raises(C.ServerDied, match="rank 2 claimed catch-up request 5 and died"):
        late._answered(5)
    late.store.keys[Keys.response(5)] = b"{}"
    assert late._answered(5) is True  # answered before it died: take the answer


def test_snapshots_on_their_way_to_a_dead_rank_are_given_up():
    """close() drained a snapshot sent to a rank that died for the whole timeout."""
    from types import SimpleNamespace

    from commrt.sync.backup import serving as S

    abandoned = []
    ex = SimpleNamespace(abandon=lambda: abandoned.append(1))
    server = S.Server.__new__(S.Server)
    to_dead = SimpleNamespace(peer=2, exchange=ex, flat="buf2", wire=None)
    to_live = SimpleNamespace(peer=1, exchange=None, flat="buf1", wire=None)
    server._sending, server._lost = [to_dead, to_live], []
    server.drop_sends_to({2, 3})
    assert server._sending == [to_live] and abandoned == [1] and server._lost == ["buf2"]
    assert server.busy


def test_a_snapshot_send_the_engine_fails_is_given_up_not_raised():
    """A late rank died while its snapshot was on the way: gloo failed the server's send
    with "Connection closed by peer", which reached the user through the progress thread
    (tools/chaos_backup.py). Now that snapshot is given up and the server goes on; on a
    stream-ordered transport (NCCL), which cannot cancel the send, it is a CommError."""
    from types import SimpleNamespace

    from commrt.errors import CommError
    from commrt.sync.backup import serving as S

    def failing_send():
        raise RuntimeError("Connection closed by peer [127.0.0.1]:2196")

    def server(stream_ordered):
        c = S.Server.__new__(S.Server)
        c.comm = SimpleNamespace(
            transport=SimpleNamespace(traits=Traits(stream_ordered=stream_ordered))
        )
        c.rank, c.timeout, c._host_progress, c._lost = 2, 30.0, True, []
        c.store = SimpleNamespace(check=lambda keys: False)
        ex = SimpleNamespace(sends_done=failing_send, abandon=lambda: None)
        sent = SimpleNamespace(peer=0, exchange=ex, flat="buf", started=time.monotonic())
        c._sending = [SimpleNamespace(**vars(sent), wire=None)]
        return c

    gloo = server(stream_ordered=False)
    gloo.progress()
    assert gloo._sending == [] and gloo._lost == ["buf"]
    with pytest.raises(CommError, match="catch-up send to rank 0 failed"):
        server(stream_ordered=True).progress()


def test_a_snapshot_send_that_fails_to_start_is_given_up_not_raised(monkeypatch):
    """A late rank died between asking and being served: gloo refused the server's send at
    once ("Connection closed by peer"), and the error escaped serve() through the arrival's
    wait, failing the step on the server (tools/chaos_backup.py, seed 113). Now that
    snapshot is given up like one failing on its way; NCCL still gets a CommError."""
    from types import SimpleNamespace

    from commrt.errors import CommError
    from commrt.sync.backup import serving as S

    def refused(*args, **kwargs):
        raise RuntimeError("Connection closed by peer [127.0.0.1]:2196")

    def server(stream_ordered):
        c = S.Server.__new__(S.Server)
        c.comm = SimpleNamespace(
            transport=SimpleNamespace(traits=Traits(stream_ordered=stream_ordered))
        )
        c.rank, c.incarnation, c.tracer, c.served = 2, 0, None, 0
        c._state_event, c._sending, c._lost = None, [], []
        c.params, c.store = [torch.zeros(3)], SimpleNamespace(set=lambda k, v: None)
        return c

    monkeypatch.setattr(S, "start_transfer", refused)

    gloo = server(stream_ordered=False)
    gloo._start_send(7, 0, (5, None), torch.optim.SGD(gloo.params, lr=0.1), (True, None))
    assert gloo._sending == [] and len(gloo._lost) == 1 and gloo.served == 1
    nccl = server(stream_ordered=True)
    with pytest.raises(CommError, match="catch-up send to rank 0 failed"):
        nccl._start_send(7, 0, (5, None), torch.optim.SGD(nccl.params, lr=0.1), (True, None))
