"""What one training step of a :class:`~commrt.GradientSync` has seen so far.

Made fresh at construction and after every ``wait()`` (:meth:`StepState.fresh`,
the one place it is reset); read and written under the progress thread's
condition variable by the gradient hooks, the progress thread and ``wait()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commrt.sync.buckets import Bucket
from commrt.sync.stats import StepStats


@dataclass
class StepState:
    # -- what backward has produced (written by the gradient hooks)
    #: per bucket: parameters still without a gradient this step
    missing: list[int]
    #: per bucket: complete (or given up on at wait()), so the progress thread may take it
    ready: list[bool]
    #: per bucket: CUDA event recorded when it became ready (None on CPU or not yet ready)
    ready_events: list
    #: id() of each parameter that got its gradient this step
    seen: set[int] = field(default_factory=set)
    #: perf_counter() of the step's first and latest gradient (None: none yet)
    first_grad_t: float | None = None
    last_grad_t: float = 0.0

    # -- what the progress thread has done
    #: buckets reduced and unpacked
    done: int = 0
    #: the next bucket the progress thread takes (buckets leave strictly in order)
    next: int = 0

    # -- stats of this step, filled in as it goes
    cur: StepStats = None

    @classmethod
    def fresh(cls, buckets: list[Bucket], step: int) -> "StepState":
        """Nothing seen yet of step ``step``."""
        nb = len(buckets)
        return cls(
            missing=[len(b.params) for b in buckets],
            ready=[False] * nb,
            ready_events=[None] * nb,
            cur=StepStats(step=step, buckets=nb),
        )

    @property
    def step(self) -> int:
        return self.cur.step

    @property
    def started(self) -> bool:
        """Some gradient of this step has arrived."""
        return self.first_grad_t is not None
