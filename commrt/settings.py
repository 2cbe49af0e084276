"""Every setting commrt reads, each declared once, as NCCL's ``NCCL_PARAM`` declares its
variables: the ``COMMRT_*`` environment variables (:class:`Variable`, all in this module)
and the time bounds (:class:`Seconds`, the module-level ``*_S`` constants, each beside its
use).

A variable's declaration holds its name, one line of help and its kind of value, as
Triton's knobs do: a :class:`Flag`, :class:`Words` (one of some choices), :class:`Bytes`,
a :class:`Period` (seconds, or off) or :class:`Text` that the reader interprets. The kind
parses and checks the text, naming the variable in its error, and holds the default that
the code uses where the variable is unset: ``settings.CUDA_IPC_SLOT_BYTES.get()`` is the
slot size, set or not. ``docs/configuration.md`` is generated from the declarations
(``python tools/configuration_page.py``; a test fails where the page and the declarations
differ, and where the library names a ``COMMRT_*`` variable that has no declaration here),
so its defaults are the values themselves.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Mapping

__all__ = [
    "Variable",
    "Flag",
    "Words",
    "Bytes",
    "Period",
    "Text",
    "Seconds",
    "VARIABLES",
    "GROUPS",
    "misspelt",
]

#: the words that turn a flag or a period off (a flag's "on" words are :data:`ON`)
OFF = ("0", "false", "no", "off")
#: the words that turn a flag on
ON = ("1", "true", "yes", "on", "detail")


def bytes_text(value: int) -> str:
    """A byte count as the configuration page shows it: 16 B, 64 KiB, 4 MiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift} {unit}"
    return f"{value} B"


# -- the kinds of value: each reads a variable's text (a ValueError naming the variable for
# one it cannot read), holds the default and says it in words for the configuration page


@dataclass(frozen=True)
class Flag:
    """On or off: :data:`ON` or :data:`OFF` (any case). ``default``: the value where unset
    (None: not given, and the reader decides)."""

    default: bool | None = None
    kind = "flag"

    @property
    def default_words(self) -> str:
        return {True: "on", False: "off", None: "unset"}[self.default]

    def read(self, name: str, text: str) -> bool:
        v = text.strip().lower()
        if v in ON:
            return True
        if v in OFF:
            return False
        raise ValueError(f"environment variable {name}={v!r}: use 1 or 0")


@dataclass(frozen=True)
class Words:
    """One of ``choices`` (any case); ``aliases`` maps other words to one of them.
    ``default``: the value where unset; None where the reader derives it, as ``derived``
    says in words."""

    choices: tuple[str, ...]
    default: str | None
    aliases: tuple[tuple[str, str], ...] = ()
    derived: str = ""

    @property
    def kind(self) -> str:
        *most, last = (f"`{c}`" for c in self.choices)
        return f"{', '.join(most)} or {last}" if most else last

    @property
    def default_words(self) -> str:
        return f"`{self.default}`" if self.default is not None else self.derived

    def read(self, name: str, text: str) -> str:
        v = text.strip().lower()
        v = dict(self.aliases).get(v, v)
        if v not in self.choices:
            raise ValueError(f"{name}={v!r} is none of {', '.join(self.choices)}")
        return v


@dataclass(frozen=True)
class Bytes:
    """A whole number of bytes, at least ``least`` and a multiple of ``multiple``;
    ``default`` where unset."""

    default: int
    least: int = 0
    multiple: int = 1
    kind = "bytes"

    @property
    def default_words(self) -> str:
        return bytes_text(self.default)

    @property
    def rule(self) -> str:
        """What a value must be, in words."""
        if self.multiple > 1:
            return f"a positive multiple of {self.multiple} bytes"
        return f"a number of bytes, {self.least} or more"

    def read(self, name: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < self.least or value % self.multiple:
            raise ValueError(f"{name} must be {self.rule}, got {text!r}")
        return value


@dataclass(frozen=True)
class Period:
    """Seconds above 0, or :data:`OFF` (read as 0.0: no period). Unset: None, and the
    reader derives the period, as ``derived`` says in words."""

    derived: str
    kind = "seconds"
    default = None

    @property
    def default_words(self) -> str:
        return self.derived

    def read(self, name: str, text: str) -> float:
        v = text.strip().lower()
        if v in OFF:
            return 0.0
        try:
            seconds = float(v)
        except ValueError:
            raise ValueError(f"{name}={v!r}: give seconds (a number) or 0 for off") from None
        if not seconds > 0:
            raise ValueError(f"{name} must be positive seconds or 0 (off), got {v!r}")
        return seconds


@dataclass(frozen=True)
class Text:
    """Text the reader interprets (a folder, a file, a name checked where it is used):
    ``kind`` says which; ``default`` where unset, said as ``default_words`` (unset: None)."""

    kind: str
    default: str | None = None
    default_words: str = "unset"

    def read(self, name: str, text: str) -> str:
        return text


@dataclass(frozen=True)
class Variable:
    """An environment variable commrt reads: ``name``, its ``value`` (a :class:`Flag`,
    :class:`Words`, :class:`Bytes`, :class:`Period` or :class:`Text`: how its text reads,
    and its default), ``help`` (one line), ``applies`` (what reads it), and, for the
    variables commrt sets for its own processes, ``set_by``."""

    name: str
    value: Flag | Words | Bytes | Period | Text
    help: str
    applies: str = ""
    set_by: str = ""

    @property
    def kind(self) -> str:
        """What a value is, in a word (the configuration page's "type")."""
        return self.value.kind

    @property
    def default_words(self) -> str:
        """The default in words, as the configuration page says it (the default itself is
        ``value.default``, what :meth:`get` gives where the variable is unset)."""
        return self.value.default_words

    def text(self, env: Mapping[str, str] | None = None) -> str:
        """The variable's value in ``env`` (``os.environ`` by default), stripped; "" where
        unset."""
        return (os.environ if env is None else env).get(self.name, "").strip()

    def get(self, env: Mapping[str, str] | None = None):
        """The variable's value in ``env`` (``os.environ`` by default), read as its kind
        reads it (a ValueError naming the variable where it cannot be); its default where
        unset or empty."""
        text = self.text(env)
        return self.value.read(self.name, text) if text else self.value.default

    def read(self, text: str):
        """``text`` read as this variable's value would be (an argument that stands for it,
        ``commrt.init(stall_s="off")``); a ValueError naming the variable."""
        return self.value.read(self.name, str(text))

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
    Flag(False),
    "`1` (or `true`, `yes`, `on`, `detail`): check every collective's arguments across "
    "ranks first and name the mismatch; `0` off",
    "`commrt.init(debug=None)`, the torch.distributed backend (`Options(debug=None)`)",
)
TRACEBACK = Variable(
    "COMMRT_TRACEBACK",
    Words(("short", "full"), "short"),
    "`full`: an error that leaves commrt shows commrt's own frames and the errors behind it "
    "(its chain); `short`: your frames and commrt's message only, with a line saying so",
    "every public call (`commrt.init`, the collectives, `GradientSync`, ...) and the "
    "abort-on-error hook ([When something goes wrong](training-loop.md#short-tracebacks))",
)
ABORT_ON_ERROR = Variable(
    "COMMRT_ABORT_ON_ERROR",
    Flag(True),
    "`0` (or `false`, `no`, `off`): an uncaught exception no longer ends the whole job; "
    "the program handles rank failures itself",
    "`commrt.init(abort_on_error=None)`, the torch.distributed backend",
)
STALL = Variable(
    "COMMRT_STALL_S",
    Period("half the timeout, within 60 s to 5 min"),
    "seconds in a collective without progress before the stall watch declares a stall "
    "and prints the verdict; `0` or `off`: no watch. Only active when shorter than the "
    "timeout",
    "`commrt.init(stall_s=None)`, the torch.distributed backend's world group "
    "([When a job stalls](stalls.md))",
)
DUMP = Variable(
    "COMMRT_DUMP",
    Text("folder"),
    "a folder where each rank writes its last positions and the verdict, for `commrt diagnose`",
    "the stall watch",
)
ALGORITHM = Variable(
    "COMMRT_ALGORITHM",
    Text("name", "auto", "`auto`"),
    "the all-reduce algorithm of a process group (`ring`, `torus2d`, "
    "`halving_doubling`, ...); gossip and backup are refused there, with where to get them",
    '`dist.init_process_group("commrt")` and `new_group`, read when the group is made '
    "(`Options(algorithm=None)`)",
)
CPU_TRANSPORT = Variable(
    "COMMRT_CPU_TRANSPORT",
    Text("name", "auto", "`auto`"),
    "the CPU transport of a process group: `auto` (the order of `commrt.runtime.choice`), "
    "`shm`, `gloo` or `mpi`",
    'the torch.distributed backend, where `Options(cpu_transport="auto")` '
    "([Shared memory](shared-memory.md))",
)
CUDA_TRANSPORT = Variable(
    "COMMRT_CUDA_TRANSPORT",
    Text("name", "auto", "`auto`"),
    "the transport of CUDA tensors: `auto` (the order of `commrt.runtime.choice`: NCCL "
    "where no two ranks of a host share a GPU, else CUDA IPC on one host), `nccl` or "
    "`cuda_ipc`; anything else is refused, naming the variable",
    '`commrt.init(backend="auto")` and the torch.distributed backend\'s CUDA communicator',
)
CUDA_IPC_SLOT_BYTES = Variable(
    "COMMRT_CUDA_IPC_SLOT_BYTES",
    Bytes(4 << 20, least=16, multiple=16),
    "the bytes of one slot of the CUDA IPC transport, a positive multiple of 16: each rank "
    "holds (ranks − 1) × 4 slots in device memory; larger slots mean fewer pieces per "
    "message, smaller ones less memory",
    "the `cuda_ipc` transport",
)
CUDA_IPC_HOST_BYTES = Variable(
    "COMMRT_CUDA_IPC_HOST_BYTES",
    Bytes(1 << 20),
    "the largest CUDA all-reduce that the CUDA IPC transport's one-shot sums on the host "
    "(a copy to pinned host memory, the sum there, a copy back) rather than on the GPU: "
    "ranks that time-share one GPU pay a context switch per cross-process wait on the "
    "device; `0` sums every size on the GPU",
    "the `cuda_ipc` transport",
)
LOG = Variable(
    "COMMRT_LOG",
    Words(
        ("off", "info", "debug"),
        None,
        aliases=(("0", "off"), ("none", "off"), ("false", "off"), ("no", "off")),
        derived="`off` (`info` where `TORCH_DISTRIBUTED_DEBUG` is `INFO` or `DETAIL`)",
    ),
    "`info`: rank 0 logs the transport `commrt.init` chose and why, and each new call of "
    "a process group once (its algorithm and why); `debug`: every rank",
    "`commrt.init`, the torch.distributed backend",
)
TRACE = Variable(
    "COMMRT_TRACE",
    Text("folder"),
    "a folder: each rank of a process group writes a Chrome trace of its calls there",
    "the torch.distributed backend",
)
CALIBRATION = Variable(
    "COMMRT_CALIBRATION",
    Text("file"),
    "a saved calibration (`commrt probe --save`) that `auto`'s probe loads instead of measuring",
    '`algorithm="auto"` wherever it runs',
)
AUTO_MEMORY = Variable(
    "COMMRT_AUTO_MEMORY",
    Text("file", None, "`$XDG_CACHE_HOME/commrt/auto-memory.json` (`~/.cache/...`)"),
    "where `auto` keeps what it learned for later jobs of the same shape "
    "(`commrt.tuning.memory`); `off`: nothing is kept or read",
    '`algorithm="auto"` wherever it runs',
)
STORE = Variable(
    "COMMRT_STORE",
    Text("host:port"),
    "`host:port` of a control store hosted outside the ranks, so that any rank may die "
    "(backup workers, gossip's rejoin); `commrt train` sets it for its ranks where one may "
    "die",
    "backup workers, gossip with a deadline",
)
REJOIN = Variable(
    "COMMRT_REJOIN",
    Flag(),
    "`1`: this process replaces a dead rank of a running job under its `RANK` (gloo "
    "only); `commrt train --max-restarts` sets it for the replacements it starts",
    "`commrt.init`, backup workers, gossip with a deadline",
)

# -- the variables commrt sets for its own processes

LAUNCHED = Variable(
    "COMMRT_LAUNCHED",
    Flag(),
    "this process is one of the ranks it started: run, do not launch again",
    set_by="the launcher",
)
LAUNCHED_AT = Variable(
    "COMMRT_LAUNCHED_AT",
    Text("time"),
    "when the launch began (`time.time()`), so a rank reports the start-up as the user saw it",
    set_by="the launcher",
)
PEER_REPORTS = Variable(
    "COMMRT_PEER_REPORTS",
    Text("folder"),
    "a folder where a rank whose peer failed writes what it was doing, for the launcher's "
    "line about the dead rank",
    set_by="the launcher",
)
RANK_FROM_MPI = Variable(
    "COMMRT_RANK_FROM_MPI",
    Text("rank"),
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
