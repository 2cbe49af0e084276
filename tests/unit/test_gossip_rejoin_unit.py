"""A dead incarnation's late news does not undo its replacement's return.

A survivor may learn that a rank's first process died only after the
replacement came back: a message to the dead process fails late. Neither
that failed message (:class:`~commrt.sync.gossip.mail.Postbox`) nor the
death it tells (:class:`~commrt.sync.gossip.deaths.DeathBoard`) may drop the
replacement from the rotation."""

import datetime
import threading
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from commrt.runtime.store import ControlStore, Host
from commrt.sync.gossip.deaths import DeathBoard
from commrt.sync.gossip.mail import ARRIVED, FAILED, Letter, Postbox
from commrt.transports.base import Traits


def _boards(*ranks: int):
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(10)
    )
    cs = ControlStore("127.0.0.1", server.port, Host.RANK0, 10.0, server)
    comms = [SimpleNamespace(rank=r, slots=SimpleNamespace(control_store=cs)) for r in ranks]
    return server, [DeathBoard(c) for c in comms]


def test_a_death_told_after_the_return_does_not_drop_the_replacement():
    server, (b0, b2, new1) = _boards(0, 2, 1)
    b0.note({1}, 4, read=True)  # rank 0 learns at once that rank 1 died
    assert b0.dead == {1}
    new1.read_all(0)
    new1.announce(1, 1)  # the replacement comes back as incarnation 1
    b2.note({1}, 7, read=False)  # rank 2's message to the dead process failed only now
    for board in (b0, b2):
        board.note(set(), 8, read=True)
        assert board.dead == set() and board.take_returns() == [(1, 1)]
        board.note(set(), 10, read=True)
        assert board.dead == set()
    # the replacement's own death, later, is news to everyone
    b2.note({1}, 12, read=False)
    b0.note(set(), 14, read=True)
    assert b0.dead == {1} and b2.dead == {1}
    del server


def test_a_death_read_in_the_log_is_not_told_again():
    server, (b0, b2) = _boards(0, 2)
    b0.note({1}, 4, read=True)
    b2.note(set(), 6, read=True)
    b2.note({1}, 7, read=True)
    assert int(b0.store.add("ndead", 0)) == 1
    del server


class _Breaks:
    """A transport whose receives wait until ``broken`` is set, then fail."""

    traits = Traits()
    name = "test"
    rank = 0

    def __init__(self):
        self.broken = threading.Event()

    def begin(self, t):
        pass

    def end(self, t):
        pass

    def exchange(self, sends, recvs, tag):
        event = self.broken

        class Pending:
            def wait_recv(self, i, deadline):
                if not event.wait(max(0.0, deadline - time.monotonic())):
                    return False
                raise ConnectionResetError("the peer's process died")

            wait_send = wait_recv

        return Pending()


class _Lands(_Breaks):
    def exchange(self, sends, recvs, tag):
        class Pending:
            def wait_recv(self, i, deadline):
                return True

            wait_send = wait_recv

        return Pending()


def _wait(box, letter):
    assert box.wait(letter, time.monotonic() + 10)


def test_a_letter_failing_on_the_dead_incarnations_route_breaks_nothing():
    old, new = _Breaks(), _Lands()
    box = Postbox(SimpleNamespace(transport=old, lock=threading.Lock()), 10.0)
    stale = Letter(5, 0, 1, torch.zeros(4))
    box.post(7, None, stale)  # a receive from rank 1's first process, still travelling
    box.route(1, new, 1)  # its replacement is admitted
    fresh = Letter(10, 0, 1, torch.zeros(4))
    box.post(8, None, fresh)
    _wait(box, fresh)  # not queued behind the dead process's letter
    assert fresh.state == ARRIVED
    old.broken.set()
    _wait(box, stale)
    assert stale.state == FAILED and box.broken_now() == set()
    # a break on the route the peer travels now is a death
    other = Letter(5, 0, 2, torch.zeros(4))
    box.post(9, None, other)
    _wait(box, other)
    assert other.state == FAILED and box.broken_now() == {2}
    box.close()
