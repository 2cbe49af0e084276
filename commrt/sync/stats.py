"""Per-step timing and traffic of a :class:`~commrt.GradientSync`.

Definitions (seconds, per step, this rank):

* ``pack_s`` / ``comm_s`` / ``unpack_s``: summed over buckets, measured on
  the thread that moves them;
* ``exposed_s``: how long :meth:`GradientSync.wait` blocked, i.e. the
  communication *not* hidden behind backward;
* ``step_s``: from the end of the previous step's ``wait``/``step`` to the
  end of this one (the training iteration as the loop sees it);
* ``bytes_sent``: bytes this rank put on the wire.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields


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
        m = self.mean()
        ms = lambda x: f"{x * 1e3:8.2f} ms"  # noqa: E731
        return "\n".join(
            [
                f"rank {self.rank} of {self.world_size}, transport {self.transport}",
                f"steps recorded      {len(self.steps)}",
                f"step time           {ms(m.step_s)}",
                f"  backward          {ms(m.backward_s)}",
                f"  exposed comm      {ms(m.exposed_s)}   ({m.overlap:.0%} of communication hidden)",
                f"  optimizer         {ms(m.optimizer_s)}",
                f"pack / comm / unpack {ms(m.pack_s)} / {ms(m.comm_s)} / {ms(m.unpack_s)}",
                f"bytes sent per step {m.bytes_sent / 1e6:10.2f} MB in {m.buckets} buckets",
                f"algorithm per bucket {per_bucket(self.algorithms)}",
                f"extra memory        {self.buffer_bytes / 1e6:.1f} MB (gradients {self.grad_bytes / 1e6:.1f} MB)",
            ]
            + (
                [
                    f"disagreement        {self.disagreement:.3e} (max over ranks of |θ_r − θ̄| / |θ̄|, "
                    f"at the last average_parameters)"
                ]
                if self.disagreement is not None
                else []
            )
        )

    def __str__(self) -> str:
        return self.summary()


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
