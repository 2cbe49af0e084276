"""Deterministic deaths inside a backup-workers all-reduce, for the redo tests.

``COMMRT_TEST_KILL="{rank}[,{rank}...]:{global step}[:STOP]"`` in a worker's
environment names the ranks that SIGKILL themselves (SIGSTOP with ``:STOP``:
a hung rank, whose connections stay open) right after their first send of
that global step's reduction has completed, inside the all-reduce. A worker
calls :func:`arm` on its GradientSync; it plugs :class:`KillAfterFirstSend`
into the library's declared seam,
:attr:`commrt.sync.backup.recovery.Reduction.wrap_round`.
"""

from __future__ import annotations

import os
import signal
from typing import Sequence

from commrt.transports.base import Forwarding, ForwardingPending, Pair, Pending, Transport

#: the variable a test sets for its worker processes (module docs)
KILL_ENV = "COMMRT_TEST_KILL"


def kill_step(rank: int) -> tuple[int, int] | None:
    """(global step, signal) with which ``COMMRT_TEST_KILL`` stops ``rank`` (None: never)."""
    spec = os.environ.get(KILL_ENV, "")
    if not spec:
        return None
    who, step, *how = spec.split(":")
    sig = signal.SIGSTOP if how == ["STOP"] else signal.SIGKILL
    return (int(step), sig) if rank in {int(r) for r in who.split(",")} else None


def arm(sync) -> None:
    """Make this rank of a backup-workers ``sync`` die as ``COMMRT_TEST_KILL`` says: once,
    in round 0 of that global step (a stopped rank that wakes goes on normally)."""
    hook = kill_step(sync.comm.rank)
    if hook is None:
        return
    step, sig = hook
    fired = []

    def wrap(transport: Transport, at: int, round: int) -> Transport:
        if at != step or round != 0 or fired:
            return transport
        fired.append(at)
        return KillAfterFirstSend(transport, sig)

    sync.policy.parts.reduction.wrap_round = wrap


class _KillAfterSend(ForwardingPending):
    def __init__(self, inner: Pending, sig: int):
        super().__init__(inner)
        self.sig, self.fired = sig, False

    def wait_send(self, i: int, deadline: float) -> bool:
        done = self.inner.wait_send(i, deadline)
        if done and not self.fired:
            self.fired = True
            os.kill(os.getpid(), self.sig)
        return done


class KillAfterFirstSend(Forwarding):
    """Forwards to ``inner`` and dies (or stops) once its first send completed."""

    def __init__(self, inner: Transport, sig: int):
        super().__init__(inner)
        self.sig = sig
        self.fired = False

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        pending = self.inner.exchange(sends, recvs, tag)
        if not sends or self.fired:
            return pending
        self.fired = True
        return _KillAfterSend(pending, self.sig)
