"""Per-step timing and traffic of a :class:`~commrt.GradientSync`.

Definitions (seconds, per step, this rank):

* ``step_s``: from the end of the previous step's ``wait``/``step`` to the
  end of this one (the training iteration as the loop sees it). Its parts,
  which tile it: ``backward_s`` (first gradient ready to last), ``exposed_s``
  (how long :meth:`GradientSync.wait` blocked, i.e. the communication *not*
  hidden behind backward), ``optimizer_s`` (in :meth:`GradientSync.step`),
  and the rest (forward, data, the loop's own code);
* ``pack_s`` / ``comm_s`` / ``unpack_s``: summed over buckets, measured on
  the progress thread that moves them, beside the step: not parts of it;
* ``bytes_sent``: bytes this rank put on the wire.

Sizes print in binary units (KiB, MiB, GiB: :func:`commrt.sim.links.fmt_bytes`, the
one format of every size commrt prints).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields

from commrt.sim.links import fmt_bytes


@dataclass
class StepStats:
    step: int
    step_s: float = 0.0
    backward_s: float = 0.0
    pack_s: float = 0.0
    comm_s: float = 0.0
    unpack_s: float = 0.0
    exposed_s: float = 0.0
    optimizer_s: float = 0.0
    bytes_sent: int = 0
    buckets: int = 0
    #: family-specific numbers (:meth:`commrt.sync.Policy.step_stats`), e.g. a gossip peer
    extra: dict = field(default_factory=dict)

    @property
    def overlap(self) -> float:
        """Share of communication hidden behind compute (1.0 = fully hidden)."""
        busy = self.pack_s + self.comm_s + self.unpack_s
        return 1.0 - min(1.0, self.exposed_s / busy) if busy > 0 else 1.0


@dataclass
class SyncStats:
    """History of :class:`StepStats` (the last ``keep`` steps) plus the algorithm per bucket,
    labelled with the rank they are of and the transport it ran on (every rank prints its
    own block: under torchrun the blocks must be told apart)."""

    keep: int = 1000
    #: this rank and the job's size
    rank: int = 0
    world_size: int = 1
    #: the transport and why it was chosen (:attr:`commrt.Communicator.transport_text`)
    transport: str = ""
    steps: deque = field(default_factory=deque)
    #: schedule name chosen for each bucket, e.g. ("ring", "ring", "torus2d")
    algorithms: tuple[str, ...] = ()
    #: bytes of the flat communication buffers plus executor scratch
    buffer_bytes: int = 0
    #: bytes of the gradients being synchronised (for comparison)
    grad_bytes: int = 0
    #: max over ranks of ||θ_r − θ̄|| / ||θ̄|| at the last commrt.average_parameters
    #: (None: never called)
    disagreement: float | None = None

    def add(self, s: StepStats) -> None:
        self.steps.append(s)
        while len(self.steps) > self.keep:
            self.steps.popleft()

    @property
    def last(self) -> StepStats | None:
        return self.steps[-1] if self.steps else None

    def mean(self, skip: int = 1) -> StepStats:
        """Average over recorded steps, skipping the first ``skip`` (warm-up)."""
        pool = list(self.steps)[skip:] or list(self.steps)
        out = StepStats(step=-1)
        if not pool:
            return out
        for f in fields(StepStats):
            if f.name not in ("step", "extra"):
                setattr(
                    out,
                    f.name,
                    type(getattr(out, f.name))(sum(getattr(s, f.name) for s in pool) / len(pool)),
                )
        return out

    def summary(self) -> str:
        """The means as a labelled block (:meth:`rows`), one line each; it ends with a
        newline, so that ``print(sync.stats)`` writes each rank's block as whole lines
        (under mpiexec, ranks' prints otherwise ran together mid-line)."""
        rows = self.rows()
        w = max(len(k) for k, _ in rows) + 2
        head = f"rank {self.rank} of {self.world_size}, transport {self.transport}\n"
        return head + "".join(f"{k.ljust(w)}{v}".rstrip() + "\n" for k, v in rows)

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) per line of :meth:`summary` below its head. The step's parts add
        up to its time, the rest named; pack, comm and unpack run on the progress thread,
        beside the step, so they are not among its parts (what of them the step waited for
        is "waiting")."""
        m = self.mean()
        skipped = " (the first left out)" if len(self.steps) > 1 else ""
        backward, waiting, optimizer, other = tile(
            m.step_s, [m.backward_s, m.exposed_s, m.optimizer_s]
        )
        busy = m.pack_s + m.comm_s + m.unpack_s
        n = m.buckets
        rows = [
            ("steps recorded", f"{len(self.steps)}{skipped}"),
            ("step time", f"{m.step_s * 1e3:.2f} ms, made of"),
            ("  backward", f"{backward:.2f} ms"),
            ("  waiting", f"{waiting:.2f} ms (in wait(): communication not hidden)"),
            ("  optimizer", f"{optimizer:.2f} ms (in step())"),
            ("  the rest", f"{other:.2f} ms (forward, data, the loop's own code)"),
            (
                "progress thread",
                f"{busy * 1e3:.2f} ms: pack {m.pack_s * 1e3:.2f} + comm {m.comm_s * 1e3:.2f} "
                f"+ unpack {m.unpack_s * 1e3:.2f} ({m.overlap:.0%} hidden)",
            ),
            (
                "bytes sent per step",
                f"{fmt_bytes(m.bytes_sent)} in {n} bucket{'' if n == 1 else 's'}",
            ),
            ("algorithm per bucket", per_bucket(self.algorithms)),
            (
                "extra memory",
                f"{fmt_bytes(self.buffer_bytes)} (gradients {fmt_bytes(self.grad_bytes)})",
            ),
        ]
        if self.disagreement is not None:
            rows.append(
                (
                    "disagreement",
                    f"{self.disagreement:.3e} (max over ranks of |θ_r − θ̄| / |θ̄|, at the "
                    "last average_parameters)",
                )
            )
        return rows

    def __str__(self) -> str:
        return self.summary()


def tile(total_s: float, parts_s: list[float]) -> list[float]:
    """``parts_s`` and the rest of ``total_s``, in milliseconds rounded to 0.01, so that the
    rounded numbers add up to the rounded total as printed (a rest that rounds below zero
    is taken from the largest part)."""
    total = round(total_s * 1e5)
    cents = [round(p * 1e5) for p in parts_s]
    rest = total - sum(cents)
    if rest < 0:
        big = cents.index(max(cents))
        cents[big] += rest
        rest = 0
    return [c / 100 for c in cents + [rest]]


def per_bucket(algorithms: tuple[str, ...]) -> str:
    """``ring (3 buckets)``; ``ring (buckets 0-1), torus2d (bucket 2)`` where they differ."""
    if not algorithms:
        return "none (no buckets)"
    if len(set(algorithms)) == 1:
        n = len(algorithms)
        return f"{algorithms[0]} ({n} bucket{'s' if n > 1 else ''})"
    runs: list[list] = []
    for b, name in enumerate(algorithms):
        if runs and runs[-1][0] == name and runs[-1][2] == b - 1:
            runs[-1][2] = b
        else:
            runs.append([name, b, b])
    return ", ".join(
        f"{n} (bucket {a})" if a == z else f"{n} (buckets {a}-{z})" for n, a, z in runs
    )
