"""Who is still there: heartbeats, missing ranks, and who holds the end of training.

A background thread adds 1 to this rank's heartbeat counter in the store
every :data:`HEARTBEAT_S` and reads everyone's; a rank whose counter has
not moved for ``dead_after_s`` is *missing* (:attr:`Liveness.missing`).
Each heartbeat thread reads all p counters, so the store (one server) sees
O(p²) reads per beat: fine for tens to a few hundred ranks, the limit
beyond. At the end, a rank that holds the final state says so under its
``fin`` key, and one that is done with the store under its ``bye`` key.
"""

from __future__ import annotations

import json
import threading
import time

from commrt.store import ControlStore
from commrt.sync.backup.keys import Keys

#: seconds between heartbeats
HEARTBEAT_S = 0.25


class Liveness:
    """This rank's heartbeat, the others' silence, and the end handshake."""

    def __init__(
        self,
        cs: ControlStore,
        space: str,
        store,
        rank: int,
        world_size: int,
        dead_after_s: float,
        timeout: float,
    ):
        self.rank, self.p = rank, world_size
        #: other ranks whose heartbeat has not moved for ``dead_after_s`` (set by the thread)
        self.missing: frozenset[int] = frozenset()
        self.dead_after_s, self.timeout = dead_after_s, timeout
        self.store = store  # the policy's connection (the end handshake)
        self._cs, self._space = cs, space  # the thread opens its own connection
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"commrt-backup-hb-r{rank}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout)

    def _beat(self) -> None:
        try:
            store = self._cs.client(self._space)
        except RuntimeError:
            return
        keys = [Keys.heartbeat(r) for r in range(self.p)]
        seen: dict[int, int] = {}
        changed = {r: time.monotonic() for r in range(self.p)}
        while not self._stop.wait(HEARTBEAT_S):
            try:
                store.add(keys[self.rank], 1)
                vals = [int(store.add(k, 0)) for k in keys]
            except RuntimeError:  # the store went away (its host ended): nothing more to watch
                return
            now = time.monotonic()
            for r, v in enumerate(vals):
                if seen.get(r) != v:
                    seen[r], changed[r] = v, now
            self.missing = frozenset(
                r for r in range(self.p) if r != self.rank and now - changed[r] > self.dead_after_s
            )

    # ------------------------------------------------------------ the end
    def hold_final(self, record: dict) -> None:
        """Say that this rank holds the final state (``record``: its step and counts)."""
        self.store.set(Keys.final(self.rank), json.dumps(record))

    def read_finals(self, ranks, into: dict[int, dict]) -> None:
        """Add to ``into`` the records of the ``ranks`` that now hold the final state."""
        for r in ranks:
            if r not in into and self.store.check([Keys.final(r)]):
                into[r] = json.loads(self.store.get(Keys.final(r)))

    def say_bye(self) -> None:
        self.store.set(Keys.bye(self.rank), "1")

    def wait_for_byes(self, ranks, deadline: float) -> None:
        """Until ``deadline`` at most, wait until every rank of ``ranks`` is done with the store."""
        keys = [Keys.bye(r) for r in ranks]
        while time.monotonic() < deadline and not self.store.check(keys):
            time.sleep(0.01)
