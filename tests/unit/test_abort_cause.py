"""Which rank an error names as where a failure began (commrt.diagnosis.abort.cause_of), from
what :class:`~commrt.errors.CommError` declares, and the one-line report's parts."""

import types

from commrt.diagnosis.abort import cause_of
from commrt.errors import CommError, CommTimeoutError, PeerFailedError
from commrt.schedule.p2p import Where, engine_error


def _engine_error(peers):
    transport = types.SimpleNamespace(departures=None, rank=1, name="gloo")
    where = Where("ring", step=0, num_steps=2, bucket=3)
    return engine_error(transport, RuntimeError("Connection closed by peer"), peers, where)


def test_an_engine_error_names_its_peers_and_where_it_waited():
    error = _engine_error([2, 0, 2])
    assert error.peers == [0, 2] and error.peer is None
    assert error.where == "algorithm ring, step 0 of 2, bucket 3"
    assert cause_of(error) is None  # two peers: either may have failed
    assert cause_of(_engine_error([2, 2])) == 2


def test_the_cause_is_the_rank_the_error_points_at():
    assert cause_of(CommError("plain")) is None
    assert cause_of(RuntimeError("not commrt's")) is None
    timeout = CommTimeoutError(rank=0, peer=3, what="recv", timeout_s=1.0)
    assert cause_of(timeout) == 3 and timeout.where == "" and timeout.peers is None
    failed = PeerFailedError(rank=0, peer=1, cause=2, unit="collective call", waiting_in=1)
    assert cause_of(failed) == 2
