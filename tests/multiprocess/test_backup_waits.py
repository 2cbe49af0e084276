"""gloo waits in backup workers: never cut into slices, given up once a peer is recorded dead.

gloo closes a pair when a wait on it times out, so a loop of short waits that looks at the
store between them breaks the very transfer it waits for (a late rank's catch-up receive did
that whenever its snapshot took longer than one slice: chaos seeds 113, 133 and 139 failed
with "Connection closed by peer" or "Application timeout caused pair closure").
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist

from commrt.schedule.p2p import Exchange, Where
from commrt.sync.backup import catchup as C
from commrt.sync.backup.waiter import MemberRecordedDead, Waiter, WaiterSlot
from commrt.transports.gloo import GlooTransport


def _pair(timeout_s: float = 10.0) -> dict[int, GlooTransport]:
    """Two gloo transports of one group, in this process (made in two threads)."""
    server = dist.TCPStore("127.0.0.1", 0, None, True)
    out = {}

    def make(rank):
        store = dist.TCPStore("127.0.0.1", server.port, None, False)
        out[rank] = GlooTransport(store, rank, 2, timeout_s)

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    out["server"] = server  # kept alive with the group
    return out


class _Comm:  # what an Exchange needs of a communicator
    timeout = 10.0

    def __init__(self):
        self.lock = threading.RLock()


def test_a_gloo_wait_that_times_out_closes_the_pair():
    """The engine fact the waits below rest on: after one short wait timed out, the pair is
    gone for good (if gloo ever stops doing this, slicing becomes safe again)."""
    g = _pair()
    work = g[1].pg.recv([torch.zeros(4)], 0, 7)
    with pytest.raises(RuntimeError, match="Timed out"):
        work.wait(datetime.timedelta(seconds=0.2))
    with pytest.raises(RuntimeError, match="pair closure"):
        g[1].pg.recv([torch.zeros(4)], 0, 8)


def test_a_catch_up_receive_longer_than_its_check_keeps_the_pair():
    """The snapshot comes 3 checks (CHECK_S) after the receive was posted: it is taken, and
    the pair still carries the next transfer."""
    g = _pair()
    store = type("S", (), {"check": staticmethod(lambda keys: False)})()
    got = torch.zeros(1000)
    ex = Exchange(_Comm(), [], [(got, 0)], 5, Where("t"), transport=g[1])

    def serve(tag, value):
        time.sleep(3 * C.CHECK_S)
        g[0].exchange([(torch.full((1000,), value), 1)], [], tag).wait_send(
            0, time.monotonic() + 10
        )

    t = threading.Thread(target=serve, args=(5, 3.0))
    t.start()
    waiters = WaiterSlot()
    C.ServerWaits(store, (0, 0), waiters, True).take(ex, time.monotonic() + 10)
    t.join()
    assert torch.equal(got, torch.full((1000,), 3.0))
    again = Exchange(_Comm(), [], [(got, 0)], 6, Where("t"), transport=g[1])
    t = threading.Thread(target=serve, args=(6, 4.0))
    t.start()
    C.ServerWaits(store, (0, 0), waiters, True).take(again, time.monotonic() + 10)
    t.join()
    waiters.close()
    assert torch.equal(got, torch.full((1000,), 4.0))


def test_a_receive_from_a_server_recorded_dead_is_given_up_at_once():
    """The server never sends (hung); once it is recorded dead the receive raises
    ServerDied within a check or two, not at the deadline."""
    g = _pair()
    dead_at = time.monotonic() + 0.5
    store = type("S", (), {"check": staticmethod(lambda keys: time.monotonic() > dead_at)})()
    ex = Exchange(_Comm(), [], [(torch.zeros(4), 0)], 5, Where("t"), transport=g[1])
    waiters = WaiterSlot()
    first = waiters.get()  # the thread the server's waits will run on
    began = time.monotonic()
    with pytest.raises(C.ServerDied, match="rank 0 was recorded dead"):
        C.ServerWaits(store, (0, 0), waiters, True).take(ex, began + 8)
    assert time.monotonic() - began < 0.5 + 3 * C.CHECK_S
    assert first.stuck and waiters.get() is not first  # the next receive gets a new thread
    waiters.close()


def test_a_waiter_marks_itself_stuck_when_a_wait_is_given_up():
    """It serves waits one after another; one given up on leaves it ``stuck``."""
    w = Waiter()
    assert w.wait(lambda: True, lambda: False) is True
    with pytest.raises(MemberRecordedDead):
        w.wait(lambda: time.sleep(0.3) or True, lambda: True, slice_s=0.01)
    assert w.stuck


def test_a_waiter_made_on_a_daemon_thread_is_not_a_daemon():
    """Waiters are made on GradientSync's progress thread, a daemon, whose flag a new thread
    inherits; as a daemon a waiter aborted the process at exit (test_backup_redo's "more
    deaths than backups" ranks exited -6)."""
    made = []

    def make():
        made.append(Waiter())

    maker = threading.Thread(target=make, daemon=True)
    maker.start()
    maker.join()
    before = set(threading.enumerate())
    waiters = [t for t in before if t.name == "commrt-wire-wait"]
    made[0].stop()
    assert waiters and all(not t.daemon for t in waiters)
