"""Every setting commrt reads, each declared once, as NCCL's ``NCCL_PARAM`` declares its
variables: the ``COMMRT_*`` environment variables (:class:`Variable`, all in this module)
and the time bounds (:class:`Seconds`, the module-level ``*_S`` constants, each beside its
use).

A declaration holds the setting's name, its type, its default and one line of help; the
code reads the setting through it, and ``docs/configuration.md`` is generated from the
declarations (``python tools/configuration_page.py``; a test fails where the page and the
declarations differ, and where the library names a ``COMMRT_*`` variable that has no
declaration here).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Mapping

__all__ = ["Variable", "Seconds", "VARIABLES", "GROUPS", "misspelt"]


@dataclass(frozen=True)
class Variable:
    """An environment variable commrt reads: ``name``, its ``kind`` (what a value is),
    the ``default`` in words, ``help`` (one line), ``applies`` (what reads it), and, for
    the variables commrt sets for its own processes, ``set_by``."""

    name: str
    kind: str
    default: str
    help: str
    applies: str = ""
    set_by: str = ""

    def text(self, env: Mapping[str, str] | None = None) -> str:
        """The variable's value in ``env`` (``os.environ`` by default), stripped; "" where
        unset."""
        return (os.environ if env is None else env).get(self.name, "").strip()

    def flag(self, env: Mapping[str, str] | None = None) -> bool | None:
        """A ``flag`` variable's value: True for ``1``, ``true``, ``yes``, ``on`` or
        ``detail``; False for ``0``, ``false``, ``no`` or ``off``; None where unset.
        ValueError naming the variable for anything else."""
        v = self.text(env).lower()
        if not v:
            return None
        if v in ("1", "true", "yes", "on", "detail"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"environment variable {self.name}={v!r}: use 1 or 0")

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        """Whether the variable is in ``env`` at all (set to anything, "" included)."""
        return self.name in (os.environ if env is None else env)


class Seconds(float):
    """A time bound in seconds, declared with its meaning: ``NAME_S = Seconds(value,
    help, applies, group)``. It is the float ``value`` wherever it is used; ``help`` (one
    line), ``applies`` (where it bounds) and ``group`` (a heading of :data:`GROUPS`) make
    its row of the configuration page."""

    help: str
    applies: str
    group: str

    def __new__(cls, value: float, help: str, applies: str, group: str) -> Seconds:
        if group not in GROUPS:
            raise ValueError(f"Seconds: group {group!r} is not one of {list(GROUPS)}")
        bound = super().__new__(cls, value)
        bound.help, bound.applies, bound.group = help, applies, group
        return bound

    def __reduce__(self):
        # pickled and copied as the plain float it stands for (an option's default that a
        # launcher hands its ranks): its meaning stays with the declaration
        return (float, (float(self),))


#: the headings the bounds are grouped under on the configuration page, in its order
GROUPS = (
    "The timeout",
    "Stalls, failures and leaving",
    "NCCL",
    "Polling and spinning",
    "auto and gossip",
    "The command line",
)
TIMEOUT, STALLS, NCCL, POLLING, AUTO, COMMAND_LINE = GROUPS

# -- the variables users set

DEBUG = Variable(
    "COMMRT_DEBUG",
    "flag",
    "off",
    "`1` (or `true`, `yes`, `on`, `detail`): check every collective's arguments across "
    "ranks first and name the mismatch; `0` off",
    "`commrt.init(debug=None)`, the torch.distributed backend (`Options(debug=None)`)",
)
TRACEBACK = Variable(
    "COMMRT_TRACEBACK",
    "name",
    "`short`",
    "`full`: an error that leaves commrt shows commrt's own frames and the errors behind it "
    "(its chain); `short`: your frames and commrt's message only, with a line saying so",
    "every public call (`commrt.init`, the collectives, `GradientSync`, ...) and the "
    "abort-on-error hook ([When something goes wrong](training-loop.md#short-tracebacks))",
)
ABORT_ON_ERROR = Variable(
    "COMMRT_ABORT_ON_ERROR",
    "flag",
    "on",
    "`0` (or `false`, `no`, `off`): an uncaught exception no longer ends the whole job; "
    "the program handles rank failures itself",
    "`commrt.init(abort_on_error=None)`, the torch.distributed backend",
)
STALL = Variable(
    "COMMRT_STALL_S",
    "seconds",
    "half the timeout, within 60 s to 5 min",
    "seconds in a collective without progress before the stall watch declares a stall "
    "and prints the verdict; `0` or `off`: no watch. Only active when shorter than the "
    "timeout",
    "`commrt.init(stall_s=None)`, the torch.distributed backend's world group "
    "([When a job stalls](stalls.md))",
)
DUMP = Variable(
    "COMMRT_DUMP",
    "folder",
    "unset",
    "a folder where each rank writes its last positions and the verdict, for `commrt diagnose`",
    "the stall watch",
)
ALGORITHM = Variable(
    "COMMRT_ALGORITHM",
    "name",
    "`auto`",
    "the all-reduce algorithm of a process group (`ring`, `torus2d`, "
    "`halving_doubling`, ...); gossip and backup are refused there, with where to get them",
    '`dist.init_process_group("commrt")` and `new_group`, read when the group is made '
    "(`Options(algorithm=None)`)",
)
CPU_TRANSPORT = Variable(
    "COMMRT_CPU_TRANSPORT",
    "name",
    "`auto`",
    "the CPU transport of a process group: `auto` (the order of `commrt.runtime.choice`), "
    "`shm`, `gloo` or `mpi`",
    'the torch.distributed backend, where `Options(cpu_transport="auto")` '
    "([Shared memory](shared-memory.md))",
)
CUDA_TRANSPORT = Variable(
    "COMMRT_CUDA_TRANSPORT",
    "name",
    "`auto`",
    "the transport of CUDA tensors: `auto` (the order of `commrt.runtime.choice`: NCCL "
    "where no two ranks of a host share a GPU, else CUDA IPC on one host), `nccl` or "
    "`cuda_ipc`; anything else is refused, naming the variable",
    '`commrt.init(backend="auto")` and the torch.distributed backend\'s CUDA communicator',
)
CUDA_IPC_SLOT_BYTES = Variable(
    "COMMRT_CUDA_IPC_SLOT_BYTES",
    "bytes",
    "4 MiB",
    "the bytes of one slot of the CUDA IPC transport, a positive multiple of 16: each rank "
    "holds (ranks − 1) × 4 slots in device memory; larger slots mean fewer pieces per "
    "message, smaller ones less memory",
    "the `cuda_ipc` transport",
)
CUDA_IPC_HOST_BYTES = Variable(
    "COMMRT_CUDA_IPC_HOST_BYTES",
    "bytes",
    "1 MiB",
    "the largest CUDA all-reduce that the CUDA IPC transport's one-shot sums on the host "
    "(a copy to pinned host memory, the sum there, a copy back) rather than on the GPU: "
    "ranks that time-share one GPU pay a context switch per cross-process wait on the "
    "device; `0` sums every size on the GPU",
    "the `cuda_ipc` transport",
)
LOG = Variable(
    "COMMRT_LOG",
    "level",
    "`off` (`info` where `TORCH_DISTRIBUTED_DEBUG` is `INFO` or `DETAIL`)",
    "`info`: rank 0 logs the transport `commrt.init` chose and why, and each new call of "
    "a process group once (its algorithm and why); `debug`: every rank",
    "`commrt.init`, the torch.distributed backend",
)
TRACE = Variable(
    "COMMRT_TRACE",
    "folder",
    "unset",
    "a folder: each rank of a process group writes a Chrome trace of its calls there",
    "the torch.distributed backend",
)
CALIBRATION = Variable(
    "COMMRT_CALIBRATION",
    "file",
    "unset",
    "a saved calibration (`commrt probe --save`) that `auto`'s probe loads instead of measuring",
    '`algorithm="auto"` wherever it runs',
)
AUTO_MEMORY = Variable(
    "COMMRT_AUTO_MEMORY",
    "file",
    "`$XDG_CACHE_HOME/commrt/auto-memory.json` (`~/.cache/...`)",
    "where `auto` keeps what it learned for later jobs of the same shape "
    "(`commrt.tuning.memory`); `off`: nothing is kept or read",
    '`algorithm="auto"` wherever it runs',
)
STORE = Variable(
    "COMMRT_STORE",
    "host:port",
    "unset",
    "`host:port` of a control store hosted outside the ranks, so that any rank may die "
    "(backup workers, gossip's rejoin); `commrt train` sets it for its ranks where one may "
    "die",
    "backup workers, gossip with a deadline",
)
REJOIN = Variable(
    "COMMRT_REJOIN",
    "flag",
    "unset",
    "`1`: this process replaces a dead rank of a running job under its `RANK` (gloo "
    "only); `commrt train --max-restarts` sets it for the replacements it starts",
    "`commrt.init`, backup workers, gossip with a deadline",
)

# -- the variables commrt sets for its own processes

LAUNCHED = Variable(
    "COMMRT_LAUNCHED",
    "flag",
    "unset",
    "this process is one of the ranks it started: run, do not launch again",
    set_by="the launcher",
)
LAUNCHED_AT = Variable(
    "COMMRT_LAUNCHED_AT",
    "time",
    "unset",
    "when the launch began (`time.time()`), so a rank reports the start-up as the user saw it",
    set_by="the launcher",
)
PEER_REPORTS = Variable(
    "COMMRT_PEER_REPORTS",
    "folder",
    "unset",
    "a folder where a rank whose peer failed writes what it was doing, for the launcher's "
    "line about the dead rank",
    set_by="the launcher",
)
RANK_FROM_MPI = Variable(
    "COMMRT_RANK_FROM_MPI",
    "rank",
    "unset",
    "the rank whose `RANK`, `WORLD_SIZE` and `LOCAL_*` were copied from MPI's variables "
    "for torch's `env://` (so the launch is still seen as mpiexec's)",
    set_by="`import commrt` under mpiexec",
)

#: every variable, in the configuration page's order
VARIABLES = (
    DEBUG,
    TRACEBACK,
    ABORT_ON_ERROR,
    STALL,
    DUMP,
    ALGORITHM,
    CPU_TRANSPORT,
    CUDA_TRANSPORT,
    CUDA_IPC_SLOT_BYTES,
    CUDA_IPC_HOST_BYTES,
    LOG,
    TRACE,
    CALIBRATION,
    AUTO_MEMORY,
    STORE,
    REJOIN,
    LAUNCHED,
    LAUNCHED_AT,
    PEER_REPORTS,
    RANK_FROM_MPI,
)


def misspelt(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(name, the declared name it nearly is)`` for each ``COMMRT_*`` variable in ``env``
    (``os.environ`` by default) that no declaration names but one nearly does: a typo (a
    letter left out of an ``ALGORITHM``) that would otherwise be ignored without a word.
    Names far from every declaration (a test harness's own) are left alone."""
    env = os.environ if env is None else env
    declared = [v.name for v in VARIABLES]
    out = []
    for name in sorted(n for n in env if n.startswith("COMMRT_") and n not in declared):
        close = difflib.get_close_matches(name, declared, n=1, cutoff=0.85)
        out += [(name, close[0])] if close else []
    return out
