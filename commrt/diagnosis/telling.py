"""The verdict told: printed on every rank, dumped, written where torchrun reads it.

Every rank prints the verdict: in full the lowest rank of each host that
answered, the others one line that points to it, as does a rank whose error's
message carries it. It writes ``COMMRT_DUMP``'s files if asked (its last
positions and the verdict, which ``commrt diagnose`` reads) and torchrun's error
file where there is one, then waits (at most
:data:`~commrt.diagnosis.hearing.PRINTED_S`) until every rank that answered has
printed: the store's host (rank 0 where no launcher hosts it) and ``mpiexec``,
which ends the job when one rank exits, cannot take the verdict from a rank that
has not printed it yet.
"""

from __future__ import annotations

import json
import os
import threading

from commrt import settings
from commrt.diagnosis.abort import say
from commrt.diagnosis.hearing import PRINTED_S, poll_store
from commrt.diagnosis.verdict import pointer, printer, render
from commrt.process.elastic import write_error_file


class Telling:
    """How one rank tells the verdict, once per process (module docs)."""

    def __init__(self, rank: int, host: str):
        self.rank, self.host = rank, host
        self._done = False
        #: set once this rank's line is out (a SIGTERM under torchrun waits for it)
        self.said = threading.Event()

    def tell(self, verdict: dict, board, told: bool, positions: list[dict]) -> None:
        """Print ``verdict`` (a pointer only where ``told``: the error this rank raises
        carries it), dump it with ``positions`` (this rank's last, oldest first), write
        torchrun's error file, say so on ``board`` (the store the verdict was formed
        through) and wait for every rank that answered to say the same."""
        if self._done:
            return
        self._done = True
        try:
            first = printer(verdict, self.host)
            if told:
                said = pointer(verdict, self.rank, "in full in the error raised here")
            elif first is None or first == self.rank:
                said = render(verdict)
            else:
                said = pointer(verdict, self.rank, f"rank {first} prints it in full")
            say(said)
            self.said.set()
            self.dump(verdict, positions)
            write_error_file(verdict, render(verdict))
            board.add("printed", 1)
            answered = sum(v["state"] == "published" for v in verdict.get("views", []))
            poll_store(lambda: int(board.add("printed", 0)) >= answered, PRINTED_S)
        except Exception:  # the store is gone: the others have ended already
            pass

    def dump(self, verdict: dict, positions: list[dict]) -> None:
        """``COMMRT_DUMP/rank<r>.json``: ``positions`` and ``verdict``, where asked."""
        if not (folder := settings.DUMP.text()):
            return
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": self.rank, "positions": positions, "verdict": verdict}, f, indent=1)
        os.replace(path + ".tmp", path)
