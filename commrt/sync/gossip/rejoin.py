"""Who is in a rank's gossip rotation at each step: the dead leave, a replacement comes back.

Gossip with a deadline (:mod:`commrt.sync.gossip.deadline`) computes its
partners with ``Gossip.peers(rank, step, p, live)``. :class:`Members` gives
``live`` for each step: every rank, less the dead (:mod:`commrt.sync.gossip.deaths`),
less a replacement before the step from which this rank admitted it.

**A replacement comes back** (``COMMRT_REJOIN=1`` with the dead rank's
``RANK``, as ``commrt train --max-restarts`` starts it; gloo and a store
hosted outside the ranks, as for backup workers,
:mod:`commrt.sync.backup.rejoin`). Its communicator has no connection on
the job's gloo group (gloo cannot add a member to a group that already
met), so every message between it and another rank travels on a two-rank
group made for that pair through the store
(:class:`~commrt.sync.backup.wire.Wire`; the :class:`~commrt.sync.gossip.mail.Postbox`
routes that peer's letters there). Keys under ``commrt/gossip/``:

=====================  ========================================================
``inc/{r}``            incarnations of rank r (a replacement takes the next, j)
``dead/{i}``           the log: ``"{r} died {j}"``, ``"{r} back {j}"`` came back
``from/{r}.{j}/``      ``"{server} {step}"``: the first rank that read the
                       return, and its step then (``compare_set``: one wins)
``ack/{r}.{j}/{s}``    the step from which rank s exchanges with the replacement
``snap/{r}.{j}``       the layout of the snapshot the server sends
``pair/{r}.{j}/{s}/``  the rendezvous of the pair group of the replacement and s
``bye/{s}``            rank s closed: a replacement does not wait for it
=====================  ========================================================

1. The replacement takes incarnation j, waits (bounded by the timeout)
   until its rank's death is in the log, then appends its return.
2. Every other rank reads the log at its next period boundary, step b (one
   store operation per period, as for deaths). The first to read it wins
   ``from`` with its step b = s0. Each rank s admits the replacement from
   step ``a_s = max(b, s0)`` (a period boundary), writes it under ``ack``,
   and makes their pair group. The winner then sends it a snapshot of its
   parameters and optimizer state (:mod:`commrt.sync.snapshot`) as they
   are at the start of step s0, over that group.
3. The replacement makes the pair group with each rank as its ``ack``
   appears (a rank recorded dead, or that closed, is not waited for),
   receives the snapshot, loads it, and runs from step s0: it exchanges with
   rank s from step ``a_s`` on, exactly as s does with it. So every pair
   agrees on every step's messages, and the replacement is in the rotation
   within one period of its return (the period each rank takes to reach its
   next boundary).

**Accounting.** The dead incarnation's messages in flight never land: a
survivor counts its receives from it as ``lost`` and its sends to it as
``lost_sends`` (:class:`~commrt.sync.gossip.ledger.GossipLedger`). Messages
between the replacement and the others are counted as any others; its
gradients from step s0 on are in its own ledger. The state the dead rank
held (its parameters, the gradient mass it had received but not applied)
is gone with it: the replacement starts from its server's.

**Not covered.** A store hosted by rank 0 (no launcher) cannot be found by
a new process; MPI and NCCL cannot add a process. Two replacements coming
back at the same moment are not tested. A rank that dies unrecorded while
a replacement waits for its ``ack`` costs the replacement the timeout; a
replacement that dies while a rank makes their pair group costs that rank
up to the timeout, in its step (the group's rendezvous cannot be left
early), and it then records the replacement dead.
"""

from __future__ import annotations

import json
import logging
import time

import torch

from commrt import settings
from commrt.errors import CommError, CommTimeoutError
from commrt.process.polling import poll
from commrt.runtime.store import ControlStore, launcher_store
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where
from commrt.sync.backup.rejoin import RejoinedTooLate
from commrt.sync.backup.wire import Wire
from commrt.sync.gossip.deaths import PREFIX, DeathBoard
from commrt.sync.snapshot import pieces

log = logging.getLogger(__name__)

#: the join step of a rank a replacement has not been admitted by
NEVER = 1 << 62
#: what the snapshot's exchange names (its errors are renamed in the job's ranks)
WHERE = Where("gossip rejoin")


class Members:
    """This rank's rotation at each step (module docs). ``snapshot()``: this rank's
    parameters and optimizer state now, as ``(flat, layout)``."""

    def __init__(self, comm, postbox, period: int, snapshot):
        self.comm, self.postbox, self.period, self.snapshot = comm, postbox, period, snapshot
        self.rank, self.p, self.timeout = comm.rank, comm.world_size, comm.timeout
        self.deaths = DeathBoard(comm) if self.p > 2 else None
        #: rank -> the step from which it is in this rank's rotation (absent: from 0)
        self.joins: dict[int, int] = {}
        #: the pair groups, by the other end's rank
        self.wires: dict[int, Wire] = {}
        #: replacements this rank admitted, and snapshots it served them
        self.admitted = self.served = 0

    @property
    def dead(self) -> set[int]:
        known = self.deaths.dead if self.deaths is not None else set()
        return known | self.postbox.broken_now()

    def live(self, step: int) -> set[int] | None:
        """The ranks in this rank's rotation at ``step`` (None: all). Reads the store's log
        at a period boundary, and admits the replacements read there."""
        broken = self.postbox.broken_now()
        if self.deaths is None:
            return set(range(self.p)) - broken if broken else None
        self.deaths.note(broken, step, step % self.period == 0)
        for rank, inc in self.deaths.take_returns():
            self._admit(rank, inc, step)
        dead = self.deaths.dead
        if not dead and not self.joins:
            return None
        return {r for r in range(self.p) if r not in dead and self.joins.get(r, 0) <= step}

    # -- the others' side: admitting a replacement

    def _admit(self, rank: int, inc: int, step: int) -> None:
        store, name = self.deaths.store, f"{rank}.{inc}"
        try:
            won = store.compare_set(f"from/{name}", "", f"{self.rank} {step}")
            server, start = (int(x) for x in won.decode().split())
            at = max(step, start)
            store.set(f"ack/{name}/{self.rank}", str(at))
            wire = self._wire(name, rank, self.rank)
            if server == self.rank:
                self._serve(store, name, wire, rank)
        except Exception as e:  # it died again, or the store did: it stays out
            log.warning("commrt: gossip: rank %d's return failed here (%s)", rank, e)
            self.deaths.mark_dead(rank, step)
            return
        self.joins[rank] = at
        self.admitted += 1
        self.postbox.route(rank, wire.transport, wire.members.index(rank))

    def _serve(self, store, name: str, wire: Wire, peer: int) -> None:
        flat, layout = self.snapshot()
        store.set(f"snap/{name}", json.dumps(layout))
        parts, at = pieces(flat), wire.members.index(peer)
        sends = [(x, at) for x in parts]
        ex = Exchange(self.comm, sends, [], tags.CATCHUP, WHERE, transport=wire.transport)
        try:
            ex.complete(time.monotonic() + self.timeout)
        except CommTimeoutError:  # its ranks are the pair group's: name the job's instead
            raise CommError(f"commrt: gossip: the snapshot for rank {peer} timed out") from None
        self.served += 1

    def _wire(self, name: str, replacement: int, other: int) -> Wire:
        """The pair group of replacement ``name`` (rank ``replacement``) and ``other``."""
        members = tuple(sorted((replacement, other)))
        cs = ControlStore.open(self.comm)
        wire = Wire(cs, PREFIX + "pair", f"{name}/{other}/", members, self.rank, self.timeout)
        self.wires[replacement if other == self.rank else other] = wire
        return wire

    # -- the replacement's side

    def rejoin(self) -> tuple[int, torch.Tensor, dict]:
        """Come back as the next incarnation of this rank (module docs, steps 1 and 3);
        return the step to start from and the snapshot ``(flat, layout)`` to load."""
        board = self.deaths
        if launcher_store() is None or board is None or board.store is None:
            raise ValueError(
                f"commrt: COMMRT_REJOIN=1 with gossip needs at least 3 ranks and the job's "
                f"control store hosted outside the ranks ({settings.STORE.name}=host:port, as "
                "`commrt train` sets, or torchrun's agent store)"
            )
        store = board.store
        inc = int(store.add(f"inc/{self.rank}", 1))

        def recorded() -> bool:
            board.read_all(0)
            return self.rank in board.learned

        if not poll(recorded, self.timeout):
            raise self._timeout(f"the death of the rank {self.rank} it replaces to be recorded")
        board.announce(self.rank, inc)
        board.read_all(0)  # to its own return: later entries are news
        board.take_returns()  # the others' earlier returns: they admit this one as any rank
        self.joins = {r: NEVER for r in range(self.p) if r != self.rank}
        return self._gather(store, f"{self.rank}.{inc}")

    def _gather(self, store, name: str) -> tuple[int, torch.Tensor, dict]:
        """Make the pair group with each rank as it admits this one; receive the snapshot."""
        waiting = set(self.joins)
        deadline, snap = time.monotonic() + self.timeout, None
        while waiting or snap is None:
            self.deaths.read_all(0)
            acked = [r for r in sorted(waiting) if store.check([f"ack/{name}/{r}"])]
            for r in acked:
                wire = self._wire(name, self.rank, r)
                self.joins[r] = int(store.get(f"ack/{name}/{r}"))
                self.postbox.route(r, wire.transport, wire.members.index(r))
            waiting -= set(acked) | {r for r in waiting if self._gone(store, r)}
            if snap is None and store.check([f"from/{name}"]):
                server, start = (int(x) for x in store.get(f"from/{name}").decode().split())
                if server in self.wires:
                    snap = (start, *self._receive(store, name, server, deadline))
                elif server not in waiting:
                    break  # the server died before admitting this rank
            elif snap is None and not waiting:
                break
            if not acked:
                if time.monotonic() > deadline:
                    raise self._timeout(f"ranks {sorted(waiting)} to admit it")
                time.sleep(0.005)
        if snap is None:
            raise RejoinedTooLate(
                f"commrt: rank {self.rank} came back ({name}) after every other rank had "
                "finished or died: there is nothing left to join"
            )
        return snap

    def _gone(self, store, rank: int) -> bool:
        return rank in self.deaths.dead or store.check([f"bye/{rank}"])

    def _receive(self, store, name: str, server: int, deadline: float):
        if not poll(lambda: store.check([f"snap/{name}"]), self.timeout):
            raise self._timeout(f"rank {server}'s snapshot")
        layout = json.loads(store.get(f"snap/{name}"))
        flat = torch.empty(layout["nbytes"], dtype=torch.uint8)
        wire = self.wires[server]
        parts, at = pieces(flat), wire.members.index(server)
        recvs = [(x, at) for x in parts]
        ex = Exchange(self.comm, [], recvs, tags.CATCHUP, WHERE, transport=wire.transport)
        try:
            ex.complete(deadline)
        except CommTimeoutError:  # its ranks are the pair group's: name the job's instead
            raise self._timeout(f"rank {server}'s snapshot") from None
        return flat, layout

    def _timeout(self, what: str) -> CommTimeoutError:
        return CommTimeoutError(
            rank=self.rank, peer=None, what=what, timeout_s=self.timeout, algorithm="gossip"
        )

    def close(self) -> None:
        """Say this rank is done, so that a replacement does not wait for it."""
        if self.deaths is not None and self.deaths.store is not None:
            try:
                self.deaths.store.set(f"bye/{self.rank}", "1")
            except Exception:  # the store's host is gone: nobody is left to wait
                pass
