"""The GradientSyncs open on one communicator: what collectives and GradientSync need
from each other.

A GradientSync step owns the communicator's wire while its buckets are in flight (their
messages are mid-sequence: another collective would pair this rank's messages with a
peer's buckets), and an asynchronous family's work may outlive ``wait()``: every other
collective lets it finish first, so that every rank issues the next one after it, in the
same order. :class:`OpenSyncs` keeps both facts for a
:class:`~commrt.runtime.communicator.Communicator` (its ``syncs``), and tells the
communicator's departures (:mod:`commrt.diagnosis.departures`) when a step begins and ends.
"""

from __future__ import annotations

import weakref


class OpenSyncs:
    """The open GradientSyncs of one communicator (held weakly), and the one whose step
    is on the wire."""

    def __init__(self, departures):
        #: the GradientSync whose step is in flight (its buckets own the message sequence);
        #: always one of :attr:`refs` (a sync registers before its first step, and is held
        #: here while active), so an empty ``refs`` says there is none
        self.active = None
        #: open GradientSyncs (weak references); a list, so that "none open" is one C-level
        #: truth test on every collective's entry (a WeakSet's len() runs Python code)
        self.refs: list[weakref.ref] = []
        self._departures = departures

    def check_idle(self) -> None:
        """Raise if a step is on the wire; let open syncs' after-step work finish."""
        if self.active is not None:
            raise RuntimeError(
                "commrt: a GradientSync step is in flight on this communicator; "
                "call sync.wait() before other collectives (or use a second "
                "communicator)"
            )
        if self.refs:
            self.quiesce()

    def quiesce(self) -> None:
        """Let GradientSync work that outlives wait() (asynchronous families) finish
        first, so that every rank issues the next collective after it, in the same order."""
        for sync in self.open():
            sync.quiesce()

    def register(self, sync) -> None:
        """Note an open GradientSync (held weakly): later collectives quiesce it first."""
        if not any(s is sync for s in self.open()):
            self.refs.append(weakref.ref(sync))

    def unregister(self, sync) -> None:
        """Forget ``sync`` (it closed)."""
        self.refs = [r for r in self.refs if r() is not None and r() is not sync]
        if self.active is sync:
            self.active = None

    def open(self) -> tuple:
        """The GradientSyncs open on this communicator (references to dropped ones pruned)."""
        live = [s for s in (r() for r in self.refs) if s is not None]
        if len(live) < len(self.refs):
            self.refs = [r for r in self.refs if r() is not None]
        return tuple(live)

    def begin_step(self, sync) -> None:
        """``sync``'s buckets own the wire until :meth:`end_step`."""
        self.active = sync
        self._departures.begin_sync(waits_on_all=not sync.policy.ranks_may_fail)

    def end_step(self, sync) -> None:
        """``sync``'s step left the wire."""
        if self.active is sync:
            self.active = None
        self._departures.end_sync()
