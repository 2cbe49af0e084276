"""Where this rank is: the executor's record of the collective it runs, kept for stalls.

A :class:`Position` is preallocated once per communicator (the executor holds
it); the hot path only writes a few attributes on it: the run it began (the
executor's record of the call: schedule, buffer size and dtype), the bucket, the
schedule step it is in (None between calls), and, on torch.distributed's
call thread, the op. No lock, no allocation, no clock read: the stall watch
(:mod:`commrt.diagnosis.stall`) samples it from another thread and notices
when it stops changing. :meth:`Position.describe` turns it into plain data
(JSON) when someone asks.
"""

from __future__ import annotations


class _Barrier:
    """The one "step" of a barrier: every rank waits on all, so no single peer is named."""

    index, recvs, sends = 0, (), ()


BARRIER = _Barrier()


class CallCheck:
    """The one "step" of a call signature's first-use check (:mod:`commrt.collectives.core`):
    every rank waits on all to compare calls. Carries the call, which no schedule names."""

    index, recvs, sends = 0, (), ()

    def __init__(self, kind: str, algorithm: str, numel: int, dtype: str):
        self.call = {"kind": kind, "algorithm": f"{algorithm}, first call", "numel": numel}
        self.call["dtype"] = dtype.replace("torch.", "")


class Position:
    """One rank's place in its collectives (module docs). Written by one thread at a time
    (whoever runs the schedule); read by the stall watch, which tolerates a torn read."""

    __slots__ = ("run", "step", "bucket", "torch_op", "runs", "failed")

    def __init__(self):
        #: the run begun last (the executor's Run: schedule, numel, dtype, ...)
        self.run = None
        #: the plan step (a StepPlan) this rank is in now; None between calls
        self.step = None
        #: the GradientSync bucket the run belongs to (None outside GradientSync)
        self.bucket: int | None = None
        #: the torch.distributed op the process group's call thread runs (None outside it)
        self.torch_op: str | None = None
        #: runs begun (a counter the watch compares; wraps never in practice)
        self.runs = 0
        #: (run count, plan step) where the last run that raised was
        self.failed: tuple | None = None

    def note_op(self, op: str | None) -> None:
        """The torch.distributed op the process group's call thread runs now (None: none),
        which the stall verdict names beside the call."""
        self.torch_op = op

    def barrier(self) -> None:
        """A barrier begins (the transport's own: no schedule); ``step = None`` ends it."""
        self.run, self.bucket, self.runs, self.step = None, None, self.runs + 1, BARRIER

    def check(self, step: CallCheck) -> None:
        """A call check begins; :meth:`end` ends it."""
        self.run, self.bucket, self.runs, self.step = None, None, self.runs + 1, step

    def end(self, done: bool) -> None:
        """A barrier or call check ends; where it failed (not ``done``) is kept for the verdict."""
        self.failed, self.step = (None if done else (self.runs, self.step)), None

    def mark(self) -> tuple:
        """What changes whenever this rank makes progress: the run count and the step."""
        return (self.runs, id(self.step))

    def describe(self, failed: bool = False) -> dict:
        """The position as plain data: the call (kind, algorithm, numel, dtype), the step
        and the peer it waits on (its first receive's, else its first send's), the bucket
        and torch op; ``in_call`` says whether a schedule is running now, or, ``failed``,
        whether the last run raised (the rank dies of that error: it is where it failed)."""
        run, step = self.run, self.step
        if step is None and failed and self.failed is not None and self.failed[0] == self.runs:
            step = self.failed[1]
        out: dict = {"in_call": step is not None, "runs": self.runs, "bucket": self.bucket}
        out["torch_op"] = self.torch_op
        if step is BARRIER:
            out.update(kind="barrier", algorithm="transport", numel=0, dtype="-")
        elif isinstance(step, CallCheck):
            out.update(step.call)
        elif run is not None:
            schedule = run.schedule
            out["kind"] = schedule.collective.value
            out["algorithm"] = schedule.name
            out["num_steps"] = schedule.num_steps
            out["numel"], out["dtype"] = int(run.numel), str(run.dtype).replace("torch.", "")
        if step is not None:
            xfers = tuple(step.recvs) + tuple(step.sends)
            out["step"] = step.index
            out["peer"] = xfers[0].peer if xfers else None
            out["waits_for"] = "recv" if step.recvs else "send"
        return out
