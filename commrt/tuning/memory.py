"""What ``auto`` learned in earlier jobs of the same shape: :class:`AutoMemory`.

A job that settles a buffer size (:mod:`commrt.algorithms.auto_learn`) has measured which
candidate is fastest there. The next job on the same machine, with the same ranks and
transport, would measure the same thing again from the model's first guess: its first calls
pay for a trial the last job already ran. So rank 0 keeps each verdict (and what learning
cost there, as that job measured it, to pace the next one's) in a file, per
*size class* (buffers from 2^(k-1) to 2^k - 1 bytes share one), and a later job starts each
size from it: the kept schedule is timed first, against its time then, and kept at once if
it still takes that long (within the margin); if it does not, the usual trial runs against
the rival the last job measured, or the model's runner-up.

**Where**: the file :data:`~commrt.settings.AUTO_MEMORY` names (default
``$XDG_CACHE_HOME/commrt/auto-memory.json``, that is ``~/.cache/commrt/auto-memory.json``);
``off`` keeps and reads nothing. Delete the file to forget everything.

**Invalidated**:

* an entry belongs to one *job shape*: commrt's and torch's versions, the transport, the
  world size, ranks per node, rank 0's host name, its CPU count and the device type; a job of
  any other shape neither reads nor changes it;
* an entry older than :data:`MAX_AGE_S` is dropped, and at most :data:`MAX_ENTRIES` are
  kept (the oldest go first);
* each later verdict for its class replaces it (a recheck that changed the kept schedule
  too), so a memory that went wrong is put right by the job that found out.

**Every rank starts from the same verdicts**: they decide which schedule each rank runs.
Rank 0 reads the file once per communicator and hands its entries to every rank in one
small gather (:meth:`commrt.tuning.hook_comm.HookComm.memory`); later writes change the
file, never what this job already read. Two jobs writing at once take turns on a lock
file; a file that cannot be read or written is warned about once and then left alone: the
job learns as if it were new.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass

from commrt import settings

__all__ = ["AutoMemory", "Verdict", "MAX_AGE_S", "MAX_ENTRIES", "size_class", "default_path"]

log = logging.getLogger(__name__)

#: an entry older than this (seconds) is dropped: a machine's software and load drift
MAX_AGE_S = settings.Seconds(
    7 * 24 * 3600.0,
    "how long a verdict of `auto` stays in its memory for later jobs",
    "`auto`'s memory of earlier jobs",
    settings.AUTO,
)
#: entries kept in the file at most (the oldest dropped first)
MAX_ENTRIES = 512
#: size classes a job shares in one gather (bit lengths 0..64 of a byte count)
CLASSES = 65
#: what marks an empty slot of the shared row
NONE = -1.0
#: numbers a verdict takes in the shared row (kept, its time, rival, its time, and the two
#: costs of learning)
FIELDS = 6


def size_class(nbytes: int) -> int:
    """The class of a buffer of ``nbytes``: its bit length (8 B to 15 B share class 4)."""
    return min(CLASSES - 1, int(nbytes).bit_length())


def default_path() -> str:
    """``$XDG_CACHE_HOME/commrt/auto-memory.json`` (``~/.cache`` where that is unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "commrt", "auto-memory.json")


def memory_path(env=None) -> str | None:
    """The file :data:`~commrt.settings.AUTO_MEMORY` names (None: ``off``)."""
    value = settings.AUTO_MEMORY.text(env)
    if value.lower() in ("off", "0", "no", "false", "none"):
        return None
    return value or default_path()


@dataclass(frozen=True)
class Verdict:
    """What a job kept for a size class: ``kept`` at ``kept_s`` a call, and its closest
    measured ``rival`` at ``rival_s`` (None where it settled without a trial); what learning
    cost there, as it measured it (:mod:`commrt.algorithms.auto_cost`): ``learn_call_s`` a
    call beyond a settled one, ``gather_s`` a phase's gather (None: not measured)."""

    kept: str
    kept_s: float
    rival: str | None = None
    rival_s: float | None = None
    learn_call_s: float | None = None
    gather_s: float | None = None


class AutoMemory:
    """The verdicts of earlier jobs of this job's shape, by size class, as rank 0 read them
    (module docs). ``path`` None: nothing is read or kept."""

    def __init__(self, shape: dict, path: str | None, writes: bool, verdicts=None):
        self.shape, self.path, self.writes = shape, path, writes
        #: size class -> Verdict, as this job read them (identical on every rank)
        self.verdicts: dict[int, Verdict] = dict(verdicts or {})
        self._failed = self._warned = False

    @staticmethod
    def shape_of(comm, per_node: int | None) -> dict:
        """The job's shape: what an entry must match to be read (module docs)."""
        import torch

        return {
            "commrt": _version(),
            "torch": torch.__version__,
            "transport": comm.transport.name,
            "world_size": comm.world_size,
            "per_node": per_node,
            "host": socket.gethostname(),
            "cpus": os.cpu_count(),
            "device": comm.device.type,
        }

    def recall(self, nbytes: int) -> Verdict | None:
        """The verdict an earlier job kept for ``nbytes``' class (None: none)."""
        return self.verdicts.get(size_class(nbytes))

    # -- the file (rank 0)

    def read(self) -> dict[int, Verdict]:
        """This shape's live entries in the file (rank 0 calls it, once per job)."""
        if self.path is None:
            return {}
        entries = self._load()
        key, out = self._key(), {}
        for e in entries:
            if e.get("shape") == key:
                learned = (e.get("learn_call_s"), e.get("gather_s"))  # since 0.x: may lack
                out[int(e["class"])] = Verdict(
                    e["kept"], e["kept_s"], e["rival"], e["rival_s"], *learned
                )
        return out

    def keep(
        self,
        nbytes: int,
        kept: str,
        kept_s: float,
        rival=None,
        rival_s=None,
        learn_call_s: float | None = None,
        gather_s: float | None = None,
    ) -> None:
        """Write the verdict for ``nbytes``' class (rank 0 only; others do nothing): ``kept``
        at ``kept_s`` a call, its closest measured ``rival`` at ``rival_s``, and what
        learning cost (:class:`Verdict`)."""
        floats = [None if x is None else float(x) for x in (rival_s, learn_call_s, gather_s)]
        verdict = Verdict(kept, float(kept_s), rival, *floats)
        if not self.writes or self.path is None or self._failed:
            return
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with _Locked(self.path + ".lock"):
                entries = self._load()
                key, cls = self._key(), size_class(nbytes)
                entries = [e for e in entries if (e.get("shape"), e.get("class")) != (key, cls)]
                entries.append({"shape": key, "class": cls, "at": time.time(), **vars(verdict)})
                entries = sorted(entries, key=lambda e: e["at"])[-MAX_ENTRIES:]
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump({"entries": entries}, f)
                os.replace(tmp, self.path)
        except OSError as e:
            self._warn("kept", e)

    def _key(self) -> str:
        return json.dumps(self.shape, sort_keys=True)

    def _load(self) -> list[dict]:
        """The file's entries younger than :data:`MAX_AGE_S` ([] where there is none)."""
        try:
            with open(self.path) as f:
                entries = json.load(f)["entries"]
            if not isinstance(entries, list):
                raise ValueError(f"'entries' is a {type(entries).__name__}, not a list")
        except FileNotFoundError:
            return []
        except OSError as e:
            self._warn("read", e)
            return []
        except (ValueError, KeyError, TypeError) as e:  # the next verdict writes it anew
            self._warn("read", e, give_up=False)
            return []
        now = time.time()
        return [e for e in entries if isinstance(e, dict) and now - e.get("at", 0) < MAX_AGE_S]

    def _warn(self, what: str, e: Exception, give_up: bool = True) -> None:
        """Warn once; ``give_up``: touch the file no more in this job (it cannot be read or
        written; a file that reads as garbage is written anew by the next verdict)."""
        if not self._warned:
            log.warning(
                "commrt: auto's memory %s could not be %s (%s): ignored", self.path, what, e
            )
        self._warned = True
        self._failed = self._failed or give_up

    # -- shared with every rank in one row of numbers

    def encode(self, labels: tuple[str, ...]) -> list[float]:
        """:attr:`verdicts` as a row of ``FIELDS × CLASSES`` numbers (labels by their index
        in ``labels``; a label not among them is left out)."""
        row = [NONE] * (FIELDS * CLASSES)
        for cls, v in self.verdicts.items():
            if v.kept not in labels or not (0 <= cls < CLASSES):
                continue
            rival = labels.index(v.rival) if v.rival in labels else NONE
            rival_s = v.rival_s if rival != NONE and v.rival_s is not None else NONE
            costs = [NONE if c is None else c for c in (v.learn_call_s, v.gather_s)]
            fields = [labels.index(v.kept), v.kept_s, rival, rival_s, *costs]
            row[FIELDS * cls : FIELDS * (cls + 1)] = fields
        return row

    @staticmethod
    def decode(row, labels: tuple[str, ...]) -> dict[int, Verdict]:
        """The verdicts :meth:`encode` wrote."""
        out = {}
        for cls in range(CLASSES):
            kept, kept_s, rival, rival_s, *costs = row[FIELDS * cls : FIELDS * (cls + 1)]
            if kept == NONE or not (math.isfinite(kept_s) and kept_s > 0):
                continue
            rival_name = labels[int(rival)] if rival != NONE else None
            learn_call_s, gather_s = (c if c >= 0 else None for c in costs)
            out[cls] = Verdict(
                labels[int(kept)],
                kept_s,
                rival_name,
                rival_s if rival_name else None,
                learn_call_s,
                gather_s,
            )
        return out


def _version() -> str:
    """commrt's version as installed (an entry must not outlive an upgrade)."""
    from importlib import metadata

    try:
        return metadata.version("commrt")
    except metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


class _Locked:
    """An exclusive lock on ``path`` (created) while inside the ``with``."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        import fcntl

        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.f.close()  # closing releases the lock
