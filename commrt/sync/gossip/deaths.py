"""Who died, as gossip with a deadline learns it: locally, then from the job's store.

A rank learns that a partner died when their connection breaks (the
:class:`~commrt.sync.gossip.mail.Postbox`'s ``broken``): at once, but only
when it next exchanges with it. So that every survivor drops a dead rank
from its schedule within one rotation period, whoever learns of a death
first writes it in the job's control store
(:class:`~commrt.runtime.store.ControlStore`), a log ``gossip/dead/{i}``
under a counter ``gossip/ndead``; every rank reads the counter once per
period (one store operation) and the new entries only when it moved.
Without a store that answers (its host died), ranks fall back to learning
deaths locally.

The same log carries returns: a replacement of a dead rank appends
``"{rank} back {incarnation}"`` (:mod:`commrt.sync.gossip.rejoin`); a reader
takes the rank off its dead and hands the return to the caller
(:meth:`DeathBoard.take_returns`), which admits it to the rotation.

A death names the incarnation that died, ``"{rank} died {incarnation}"``:
the one its teller last knew of (0, the rank's first process, until it read
a return). A rank may learn of the old incarnation's death only after its
replacement came back (a message to the dead process fails late); its entry
then follows the return in the log, and a reader that read the return
ignores it instead of dropping the replacement.
"""

from __future__ import annotations

import logging

from commrt.runtime.store import ControlStore

log = logging.getLogger(__name__)

#: the keys' prefix in the control store
PREFIX = "commrt/gossip/"
#: the word of a return in the log: ``"{rank} back {incarnation}"``
BACK = "back"
#: the word of a death in the log: ``"{rank} died {incarnation}"``
DIED = "died"


class DeathBoard:
    """The deaths this rank knows of, and when it learned each (its step)."""

    def __init__(self, comm):
        #: {dead rank: the step at which this rank learned of it}
        self.learned: dict[int, int] = {}
        self._reported: set[int] = set()
        self._seen = 0
        self._returns: list[tuple[int, int]] = []
        #: {rank: its latest incarnation this rank read of} (absent: 0, the first)
        self.incarnation: dict[int, int] = {}
        self.rank = comm.rank
        try:  # collective when rank 0 hosts the store: called from setup, on every rank
            self._store = ControlStore.open(comm).client(PREFIX)
        except Exception as e:  # no store: local knowledge only
            log.warning("commrt: gossip deaths stay local (no control store: %s)", e)
            self._store = None

    @property
    def dead(self) -> set[int]:
        return set(self.learned)

    def note(self, broken: set[int], step: int, read: bool) -> bool:
        """Record the ranks whose connection broke here (and tell the store); ``read``: also
        read the deaths others wrote. True when the set of the dead grew."""
        before = len(self.learned)
        for rank in broken - self._reported:
            self._reported.add(rank)
            if rank in self.learned:  # read in the log already
                continue
            self.learned[rank] = step
            self._call(self._tell, rank)
        if read:
            self._call(self._read, step)
        return len(self.learned) > before

    @property
    def store(self):
        """The store client (None: deaths stay local)."""
        return self._store

    def take_returns(self) -> list[tuple[int, int]]:
        """(rank, incarnation) of the replacements read since the last call (not this rank)."""
        out, self._returns = self._returns, []
        return out

    def readmit(self, rank: int, incarnation: int) -> None:
        """``rank`` is alive again as ``incarnation``: a later break of it is news again."""
        self.learned.pop(rank, None)
        self._reported.discard(rank)
        self.incarnation[rank] = incarnation

    def mark_dead(self, rank: int, step: int) -> None:
        """``rank`` is dead as far as this rank is concerned (its return failed here)."""
        self.learned.setdefault(rank, step)

    def announce(self, rank: int, incarnation: int) -> None:
        """Append ``rank``'s return as ``incarnation`` to the log."""
        self._log(f"{rank} {BACK} {incarnation}")

    def read_all(self, step: int) -> None:
        """Read the log to its end now (a replacement, before it comes back)."""
        self._read(step)

    def _tell(self, rank: int) -> None:
        self._log(f"{rank} {DIED} {self.incarnation.get(rank, 0)}")

    def _log(self, entry: str) -> None:
        n = self._store.add("ndead", 1)
        self._store.set(f"dead/{n}", entry)

    def _read(self, step: int) -> None:
        n = self._store.add("ndead", 0)
        while self._seen < n:
            key = f"dead/{self._seen + 1}"
            if not self._store.check([key]):  # counted, not written yet: next period
                return
            self._seen += 1
            rank, word, inc = self._store.get(key).decode().split()
            rank, inc = int(rank), int(inc)
            if word == DIED:
                if inc >= self.incarnation.get(rank, 0):  # not an earlier one's, told late
                    self.learned.setdefault(rank, step)
            else:  # a replacement came back: alive, admitted by the caller
                self.readmit(rank, inc)
                if rank != self.rank:
                    self._returns.append((rank, inc))

    def _call(self, what, arg) -> None:
        if self._store is None:
            return
        try:
            what(arg)
        except Exception as e:  # the store's host died: local knowledge from now on
            log.warning("commrt: gossip deaths stay local from now on (store: %s)", e)
            self._store = None
