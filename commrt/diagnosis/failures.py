"""What a communicator does before a failed call's error is raised, so that the peers and
the stall verdict name the failure where it began.

:mod:`commrt.runtime.communicator` calls these with its stall watch (None when off) and
its departures; neither acts for backup workers' steps, whose family goes on without
ranks that fail (``departures.waits_on_all`` is false there).
"""

from __future__ import annotations

from commrt.diagnosis.abort import cause_of
from commrt.diagnosis.departures import FAILED
from commrt.errors import CommError, CommTimeoutError, PeerFailedError


def verdict_at_timeout(stall, departures, error: CommTimeoutError) -> None:
    """Before ``error`` (a wait ran out of the communicator's timeout) is raised: the stall
    verdict joins its message (:meth:`commrt.diagnosis.stall.StallWatch.at_error`)."""
    if stall is not None and departures.waits_on_all:
        stall.at_error(error)


def failed_in_call(stall, departures, error: CommError) -> None:
    """Before ``error`` is raised, where the engine broke under a call (a peer's connection
    closed) or a peer failed: a farewell saying that this rank failed, and at which rank
    the failure began where the error names one. Whatever the program then does (it may
    catch the error and exit), the peers' errors and a stall verdict follow the chain past
    this rank instead of taking it for the cause. Where a stall was declared (a peer that
    timed out may have closed the connection this rank waited on: this rank's own timeout
    never comes), its verdict joins the error's message
    (:meth:`commrt.diagnosis.stall.StallWatch.after_broken_call`)."""
    broke = type(error) is CommError and error.peers is not None
    if (broke or isinstance(error, PeerFailedError)) and departures.waits_on_all:
        departures.announce(FAILED, cause_of(error))
        if stall is not None:
            peers = error.peers if error.peers is not None else [error.peer]
            stall.after_broken_call(error, [p for p in peers if p is not None])
