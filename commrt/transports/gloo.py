"""gloo transport: torch.distributed's ProcessGroupGloo, send/recv.

The process group is commrt's own (built on a TCPStore), not torch's global
default group, so a user's ``torch.distributed.init_process_group`` and
commrt live side by side.
"""

from __future__ import annotations

import datetime
import time
from typing import Sequence

import torch
import torch.distributed as dist

from commrt.transports import traits as engine
from commrt.transports.base import Pair, Pending, Transport, average_first


def _wire(t: torch.Tensor) -> torch.Tensor:
    # gloo moves bytes; a uint8 view sidesteps its per-dtype support lists.
    return t.view(torch.uint8) if t.dtype.is_floating_point else t


def wait_work(work, deadline: float) -> bool:
    """Bounded wait on a gloo Work; False if the deadline passed first.

    gloo's send/recv works do not report completion through
    ``is_completed()`` (it stays False), so they cannot be polled; their
    ``wait(timeout)`` is bounded, though, and raises on expiry.
    """
    left = deadline - time.monotonic()
    try:
        work.wait(datetime.timedelta(seconds=max(left, 1e-3)))
        return True
    except RuntimeError:
        if time.monotonic() >= deadline - 1e-3:
            return False
        raise


class _GlooPending(Pending):
    __slots__ = ("sworks", "rworks")

    def __init__(self, sworks, rworks):
        self.sworks, self.rworks = sworks, rworks

    # A gloo Work must not be waited on twice (the second wait blocks until its timeout), but
    # the Pending contract lets the executor wait on a send again (it does after sends_first):
    # a finished work is dropped, so that a repeated wait returns at once, as MPI's Test does.
    def wait_recv(self, i: int, deadline: float) -> bool:
        return self._wait(self.rworks, i, deadline)

    def wait_send(self, i: int, deadline: float) -> bool:
        return self._wait(self.sworks, i, deadline)

    @staticmethod
    def _wait(works, i: int, deadline: float) -> bool:
        if works[i] is None:
            return True
        if wait_work(works[i], deadline):
            works[i] = None
            return True
        return False


class GlooTransport(Transport):
    """Point-to-point over a ProcessGroupGloo built from ``store``."""

    name = "gloo"
    traits = engine.GLOO

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: float):
        super().__init__(rank, world_size, torch.device("cpu"))
        #: the rendezvous store, which also carries a closing rank's farewell (commrt.diagnosis.departures)
        self.store = store
        self.pg = dist.ProcessGroupGloo(
            store, rank, world_size, datetime.timedelta(seconds=timeout)
        )

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        pg = self.pg
        rworks = [pg.recv([_wire(t)], peer, tag) for t, peer in recvs]
        sworks = [pg.send([_wire(t)], peer, tag) for t, peer in sends]
        return _GlooPending(sworks, rworks)

    def barrier(self, timeout: float) -> bool:
        return wait_work(self.pg.barrier(), time.monotonic() + timeout)

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        average_first(tensor, op, self.world_size)  # the rule: scaled before the sum
        self.pg.allreduce([tensor]).wait()

    def abort(self) -> None:
        """Close this group's connections now: a peer blocked on this rank gets an error at
        once instead of at the timeout (backup workers abort a group whose reduction failed,
        so the failure reaches every member fast). The group is unusable afterwards."""
        if self.pg is not None:
            self.pg.abort()
        self.pg = None

    def close(self) -> None:
        self.pg = None


class GlooRejoined(Transport):
    """The transport of a replacement process that rejoined a running job under a dead
    rank's number (``COMMRT_REJOIN=1``, :mod:`commrt.sync.backup.rejoin`).

    gloo cannot add a member to a group that already met, so this rank has no connection
    on the job's group: every exchange here is refused with an error that says so. What
    it takes part in (backup workers' reductions and catch-up) runs on gloo groups made
    after it came back."""

    name = "gloo"
    traits = engine.GLOO_REJOINED

    def __init__(self, rank: int, world_size: int):
        super().__init__(rank, world_size, torch.device("cpu"))
        self.store = None  # no farewell: the others never wait on this group for it

    def _refuse(self, what: str):
        raise RuntimeError(
            f"commrt: rank {self.rank} rejoined a running job (COMMRT_REJOIN=1): gloo cannot "
            f"add it to the job's group, so {what} cannot run on the communicator; only "
            "backup workers' GradientSync (which makes groups for it) can"
        )

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        self._refuse("a point-to-point exchange")

    def barrier(self, timeout: float) -> bool:
        self._refuse("a barrier")

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self._refuse("an all-reduce")
