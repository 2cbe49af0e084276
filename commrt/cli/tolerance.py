"""What a launched job may lose: ranks that linger once the others are done, and
replacements of dead ranks (:mod:`commrt.cli.launch` supervises both)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from commrt import settings


class Lingering:
    """Ranks still running ``linger_s`` after every other rank finished well, in a job that
    may lose that many (backup workers). The others carried on without them, so a rank
    stopped (SIGSTOP, a debugger) or hung would otherwise keep the launcher, and the job,
    waiting forever once its peers are done."""

    def __init__(self, tolerate: int, linger_s: float | None):
        self.tolerate, self.linger_s = tolerate, linger_s
        #: since when only ranks the job may lose still run (None: not so now)
        self.since: float | None = None

    def overdue(self, codes: list[int | None]) -> list[int]:
        """The ranks to stop now: empty while they still have time."""
        running = [r for r, c in enumerate(codes) if c is None]
        failed = sum(1 for c in codes if c)
        # tolerate < the number of ranks, so at least one rank finished well here
        if self.linger_s is None or not running or len(running) + failed > self.tolerate:
            self.since = None
            return []
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        return running if now - self.since > self.linger_s else []

    def lines(self, procs: list[subprocess.Popen], ranks: list[int]) -> list[str]:
        """What the launcher says about the ranks it stops (each within 80 columns)."""
        out = []
        for r in ranks:
            out.append(
                f"commrt: rank {r} was still running {self.linger_s:g} s after the other "
                "ranks ended"
            )
            stopped = stopped_now(procs[r].pid)
            why = "it is stopped: SIGSTOP or a debugger" if stopped else "it may hang"
            out.append(f"commrt: ({why}); the launcher stopped it")
        return out


class Replacements:
    """Starts replacements of dead ranks (``COMMRT_REJOIN=1``), up to ``limit`` in all."""

    def __init__(self, start, limit: int):
        self.start, self.left, self.limit = start, limit, limit

    def __call__(self, procs: list[subprocess.Popen]) -> None:
        """Replace each rank of ``procs`` that failed while another still runs."""
        running = any(p.poll() is None for p in procs)
        for rank, p in enumerate(procs):
            code = p.poll()
            if not code or not running or not self.left:
                continue
            self.left -= 1
            how = f"was killed by {signame(-code)}" if code < 0 else f"exited with status {code}"
            used = self.limit - self.left
            # on a terminal rank 0's progress bar holds the cursor mid-line: start a new one
            fresh = "\n" if sys.stderr.isatty() else ""
            print(
                f"{fresh}commrt: rank {rank} {how}; started a replacement ({used} of {self.limit})",
                file=sys.stderr,
                flush=True,
            )
            procs[rank] = self.start(rank, **{settings.REJOIN.name: "1"})


def stopped_now(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger); False where unknown."""
    from commrt.transports.processes import stopped

    return stopped(pid)


def signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
