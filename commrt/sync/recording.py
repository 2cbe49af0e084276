"""Stats and trace events of each GradientSync step, recorded on the caller's thread.

A step, as the training loop sees it, runs from the end of the previous
``wait()``/``step()`` to the end of this one: compute (forward and
backward, buckets leaving as it goes), the wait for buckets still in
flight, then the optimizer. :class:`StepRecorder` keeps where the current
step began and turns a finished :class:`~commrt.sync.step_state.StepState`
into a :class:`~commrt.sync.stats.StepStats` entry and trace spans.
"""

from __future__ import annotations

import time

from commrt.sync.stats import SyncStats
from commrt.sync.step_state import StepState


class StepRecorder:
    """Per-step numbers into ``stats``, and spans into ``tracer`` (None: no trace)."""

    def __init__(self, stats: SyncStats, tracer):
        self.stats, self.tracer = stats, tracer
        #: where the current step began: perf_counter() seconds, and trace microseconds
        self.step_start = time.perf_counter()
        self.step_start_us = tracer.now_us() if tracer else 0.0

    def now(self) -> tuple[float, float]:
        """perf_counter() seconds and trace microseconds (0 without a trace)."""
        return time.perf_counter(), self.tracer.now_us() if self.tracer else 0.0

    def waited(
        self, state: StepState, t_wait: float, end: float, extra: dict, buffer_bytes: int
    ) -> None:
        """The step's buckets are done: ``wait()`` began at ``t_wait`` and ends at ``end``."""
        cur = state.cur
        cur.exposed_s = end - t_wait
        if state.started:
            cur.backward_s = state.last_grad_t - state.first_grad_t
        cur.step_s = end - self.step_start
        cur.extra = extra
        self.stats.add(cur)
        self.stats.buffer_bytes = buffer_bytes
        self.step_start = end

    def trace_wait(self, state: StepState, t_wait: float, wait_us: float) -> None:
        """Spans of the step's compute, backward and wait (which began at ``wait_us``)."""
        if self.tracer is None:
            return
        step = state.step
        now_us = self.tracer.now_us()
        self.tracer.add("commrt/compute", self.step_start_us, wait_us, step=step)
        self.tracer.add("commrt/wait", wait_us, now_us, step=step)
        if state.started:
            # backward's times are perf_counter() seconds: place them relative to the wait
            off = (state.first_grad_t - t_wait) * 1e6
            self.tracer.add(
                "commrt/backward",
                wait_us + off,
                wait_us + (state.last_grad_t - t_wait) * 1e6,
                step=step,
            )
        self.step_start_us = now_us

    def optimized(self) -> None:
        """The optimizer ran from the end of the wait until now: it ends the step.

        It starts where the wait's span ended, not at a fresh clock reading, so
        the phases tile the loop exactly: whatever ran between the two (the step
        state's reset, a GIL hand-off to another thread) is not a gap."""
        t0, us0 = self.step_start, self.step_start_us
        t1 = time.perf_counter()
        last = self.stats.last
        last.optimizer_s = t1 - t0
        last.step_s += t1 - t0
        self.step_start = t1
        if self.tracer is not None:
            now = self.tracer.now_us()
            self.tracer.add("commrt/optimizer", us0, now, step=last.step)
            self.step_start_us = now
