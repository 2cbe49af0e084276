"""The groups backup workers' reductions run on.

On gloo the policy owns the transport its participants all-reduce on, apart
from the communicator's (which catch-up keeps using): a
:class:`~commrt.transports.gloo.GlooTransport` whose rendezvous is a prefix
of the control store (:meth:`Keys.wire <commrt.sync.backup.keys.Keys.wire>`).
Owning it lets a rank whose reduction failed *abort* it: its connections
close, so every peer blocked on it fails at once and the failure runs
around the group in milliseconds instead of each rank waiting out the
timeout. A group whose peer died is not reused either: its receives that
never completed stay posted, and would take a later message with the same
tag. So the group of every rank, made at setup, serves until the first
failure; after it, a round runs on a group made for its N participants,
which the next step reuses when its participants are the same ranks
(:mod:`commrt.sync.backup.recovery`).

**A death while a group is made.** gloo's rendezvous waits in the store for
every member's address, for the group's whole timeout: a member that died
before writing it costs the others that timeout. A group made for a round
is therefore made through
:class:`PollingStore`, whose waits poll and give up as soon as the caller
says a member was recorded dead (about ``dead_after_s`` after the death).

**A hung member.** A stopped (not dead) member keeps its connections open,
so gloo gives the ranks waiting on it no error, and gloo's waits cannot be
polled or left early (a send or receive reports nothing through
``is_completed()``; a wait that times out breaks the connection; ``abort()``
from another thread does not end it). So a round's waits run on a thread of
the group's own (:class:`WaiterTransport`): the caller waits for that
thread in short slices and gives up, with an engine error the reduction
redoes, as soon as a member of the round is recorded dead (about
``dead_after_s`` after it stopped beating) rather than at the timeout. The
abandoned wait ends on its own at gloo's timeout; the group is aborted and
never used again. The handoff costs a few tens of microseconds per wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Sequence

import torch.distributed as dist

from commrt.sync.backup.keys import Keys
from commrt.sync.backup.waiter import WaiterTransport
from commrt.transports.gloo import GlooTransport


class PollingStore(dist.Store):
    """A store for a gloo rendezvous (``inner``) whose waits give up once ``gone()`` is
    true (a member was recorded dead) instead of lasting the group's timeout. gloo calls
    ``get``, which waits for the key; a wait polls ``check``, never a blocking wait that
    could not be left."""

    def __init__(self, inner, gone: Callable[[], bool], timeout: float):
        super().__init__()
        # (dist.Store has a read-only ``timeout`` property of its own)
        self.inner, self.gone, self.limit_s = inner, gone, timeout

    def set(self, key, value):
        self.inner.set(key, value)

    def get(self, key):
        self.wait([key])
        return self.inner.get(key)

    def add(self, key, value):
        return self.inner.add(key, value)

    def check(self, keys):
        return self.inner.check(keys)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        pass  # this store's waits are bounded by ``timeout`` and ``gone``

    def wait(self, keys, timeout=None):
        deadline, pause = time.monotonic() + self.limit_s, 0.0005
        while not self.inner.check(keys):
            if self.gone():
                raise RuntimeError(f"a member was recorded dead while the group was made ({keys})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the group's rendezvous timed out waiting for {keys}")
            time.sleep(pause)
            pause = min(2 * pause, 0.01)


class Wire:
    """A gloo group over ``members`` (global ranks, in group rank order), owned by the policy."""

    def __init__(
        self,
        cs,
        space: str,
        key: str,
        members: Sequence[int],
        rank: int,
        timeout,
        names=(),
        gone: Callable[[], bool] | None = None,
        wait_gone: Callable[[], bool] | None = None,
    ):
        """``gone()``: a member was recorded dead (ends the rendezvous); ``wait_gone()``: the same
        for the members a wait is on, checked while it waits (module docs)."""
        self.members = tuple(members)
        #: the members' ticket names (their incarnations: a replacement is another member)
        self.names = tuple(names)
        store = cs.client(f"{space}/{key}")
        if gone is not None:  # a member's death ends the rendezvous (module docs)
            store = PollingStore(store, gone, timeout)
        gloo = GlooTransport(store, self.members.index(rank), len(self.members), timeout)
        self.transport = gloo if wait_gone is None else WaiterTransport(gloo, wait_gone)
        self.failed = False  # aborted after a failure: never used again

    def schedules(self, inner: list, participants: Sequence[int]) -> list:
        """Per bucket: the inner all-reduce among ``participants``, numbered as this group."""
        ranks = tuple(self.members.index(r) for r in participants)
        return [a.schedule(len(self.members), ranks) for a in inner]

    def abort(self) -> None:
        self.failed = True
        self.transport.abort()


def make_wire(
    cs, space: str, step: int | None, round: int, members, rank: int, timeout, names=(), gone=None
) -> Wire:
    """The group of round ``round`` of ``step`` (None: every rank's, at setup); collective
    over ``members`` (``names``: their ticket names). ``gone()``: a member of the round was
    recorded dead; it ends the group's rendezvous (not at setup: every rank is there) and
    its waits at once."""
    rendezvous = gone if step is not None else None
    return Wire(cs, space, Keys.wire(step, round), members, rank, timeout, names, rendezvous, gone)
