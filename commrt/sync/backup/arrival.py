"""Arrival: which N of the N + b ranks take part in a global step.

When a rank's first bucket of global step g is ready, it takes a ticket
with the store's atomic ``add`` on the step's counter and writes its name
under that ticket. Tickets 1..N are the step's participants; every rank
reads the same N names, so all agree on who takes part, and nothing else
is central. A rank that ends training takes a ticket marked "closing"
(:meth:`Arrival.take` with ``closing=True``): a step whose first N
tickets include one makes no update. A replacement of a dead rank
(:mod:`commrt.sync.backup.rejoin`, incarnation j >= 1) writes ``"{rank}.{j}"``,
so that ranks that compare two steps' participants tell it from the rank it
replaced.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from commrt.errors import CommTimeoutError
from commrt.process.polling import poll
from commrt.sync.backup.keys import CLOSING, Keys, rank_of


def round_s(seconds: float) -> float:
    """``seconds`` to a tenth, for a message."""
    return float(f"{seconds:.1f}")


class Role(enum.Enum):
    ON_TIME = "on time"
    LATE = "late"
    FINAL = "after the end"  # training has ended; nothing to do
    JOINING = "joining"  # a replacement's first step: no ticket, it catches up


class Arrival:
    """Tickets of global steps in one key space of the control store."""

    def __init__(
        self,
        store,
        cs,
        space: str,
        rank: int,
        world_size: int,
        n: int,
        algorithm,
        timeout: float,
        incarnation: int = 0,
    ):
        self.store = store  # the policy's connection
        self._cs, self._space = cs, space  # a fresh connection for the timeout's report
        self.rank, self.p, self.n = rank, world_size, n
        self.algorithm, self.timeout = algorithm, timeout
        #: this rank's name on a ticket (its incarnation after a rejoin)
        self.name = f"{rank}.{incarnation}" if incarnation else str(rank)

    def take(self, step: int, closing: bool = False, round: int = 0) -> int:
        """Take the next ticket of ``step`` (in redo round ``round``); return its number
        (1 for the first rank)."""
        pos = int(self.store.add(Keys.tickets(step, round), 1))
        name = f"{CLOSING if closing else ''}{self.name}"
        self.store.set(Keys.ticket(step, pos - 1, round), name)
        return pos

    def first_n(self, step: int, idle: Callable[[], None], round: int = 0) -> list[str]:
        """The names under tickets 1..N of ``step`` (waits for them, bounded).

        While it waits, ``idle()`` runs now and then: this rank answers catch-up
        requests there, and a rank that is still catching up may be one of the N
        this step waits for. ``idle`` may raise to give up the wait."""
        keys = [Keys.ticket(step, i, round) for i in range(self.n)]
        if not poll(lambda: self.store.check(keys), self.timeout, idle):
            raise self.timeout_error(step, round)
        return [v.decode() for v in self.store.multi_get(keys)]

    def arrive(
        self, step: int, idle: Callable[[], None]
    ) -> tuple[Role, tuple[int, ...], tuple[str, ...]]:
        """Take a ticket of ``step`` and wait for its first N: this rank's role, the
        participants (none when training ended at ``step``) and their ticket names."""
        pos = self.take(step)
        names = self.first_n(step, idle)
        if self.closes(names):
            return Role.FINAL, (), ()
        ranks = tuple(sorted(rank_of(s) for s in names))
        return (Role.ON_TIME if pos <= self.n else Role.LATE), ranks, tuple(sorted(names))

    @staticmethod
    def closes(names: list[str]) -> bool:
        """Whether a step with these first N names ends training (no update)."""
        return any(s.startswith(CLOSING) for s in names)

    def timeout_error(
        self, step: int, round: int = 0, dead=(), waited: float | None = None
    ) -> CommTimeoutError:
        """The error of a step (or redo round) that did not get N arrivals: it names the
        ranks that never took a ticket, and ``dead`` (ranks recorded dead) among them.
        ``waited``: raised after that many seconds, before the timeout, because the ranks
        recorded dead leave fewer than N that could ever arrive."""
        # a fresh connection: the timed-out one may still receive the late reply
        store = self._cs.client(self._space)
        count = int(store.add(Keys.tickets(step, round), 0))
        arrived = set()
        for i in range(count):
            key = Keys.ticket(step, i, round)
            if store.check([key]):
                arrived.add(rank_of(store.get(key).decode()))
        if waited is not None:  # the dead are why; a live rank may just not have come yet
            missing = sorted(set(dead))
        else:
            missing = sorted((set(range(self.p)) - arrived) | set(dead))
        why = "recorded dead" if waited is not None else "gone"
        return CommTimeoutError(
            rank=self.rank,
            peer=missing[0] if missing else None,
            timeout_s=self.timeout if waited is None else round_s(waited),
            algorithm=str(self.algorithm),
            step=step,
            what=(
                f"the first {self.n} of {self.p} gradients of global step {step}"
                f"{f' (redo round {round})' if round else ''}; only "
                f"{len(arrived)} ranks arrived, missing ranks {missing} (more than "
                f"backups={self.algorithm.backups} {why})"
            ),
        )
