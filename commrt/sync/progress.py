"""The progress thread: the one thread that moves a GradientSync's buckets.

It takes buckets strictly in bucket order (so every rank issues the same
sequence of messages): packs a bucket's gradients into its buffer, hands
the buffer to the family's policy and unpacks the result into ``.grad``
(:class:`BucketRunner`). After the last bucket of a step it runs the
policy's after-step work, which may outlive ``wait()``.

:class:`ProgressThread` holds the thread and everything it shares with the
caller's thread (the step's :class:`~commrt.sync.step_state.StepState`, the
error it hit, whether it is closing or busy after a step), all guarded by
one condition variable, ``cv``.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch

from commrt.errors import CommError, CommTimeoutError
from commrt.process.threads import background_thread, idle_wait
from commrt.sync.buffers import BucketBuffers
from commrt.sync.policy import Policy
from commrt.sync.step_state import StepState


class BucketRunner:
    """Pack, communicate and unpack one bucket, timed; on a GPU, on the transport's stream."""

    def __init__(self, buffers: BucketBuffers, policy: Policy, comm, tracer):
        self.buffers, self.policy, self.comm, self.tracer = buffers, policy, comm, tracer
        self.cuda = comm.device.type == "cuda"
        #: CUDA event recorded after the latest bucket's unpack (wait() orders the caller after it)
        self.done_event = None

    def span(self, name: str, b: int):
        """A trace span (and NVTX range), or nothing when tracing is off."""
        if self.tracer is None:
            return contextlib.nullcontext()
        return self.tracer.span(name, bucket=b)

    def run(self, step: int, b: int, ready_event) -> tuple[float, float, float, int]:
        """Bucket ``b`` of ``step``; returns seconds packing, communicating, unpacking and
        the bytes sent."""
        if self.tracer is None and not self.cuda:
            return self._run_plain(step, b)
        comm = self.comm
        t0 = time.perf_counter()
        with comm.transport.stream():
            if ready_event is not None:  # the stream waits for backward to have written them
                torch.cuda.current_stream(comm.device).wait_event(ready_event)
            with self.span(f"commrt/bucket{b}/pack", b):
                self.buffers.pack(b, self.policy.scale(step))
            t1 = time.perf_counter()
            with self.span(f"commrt/bucket{b}/comm", b):
                sent = self.policy.communicate(step, b, self.buffers.buffers[b])
            t2 = time.perf_counter()
            with self.span(f"commrt/bucket{b}/unpack", b):
                self.buffers.unpack(b)
            if self.cuda:
                self.done_event = torch.cuda.Event()
                self.done_event.record(torch.cuda.current_stream(comm.device))
        return t1 - t0, t2 - t1, time.perf_counter() - t2, sent

    def _run_plain(self, step: int, b: int) -> tuple[float, float, float, int]:
        """:meth:`run` without a device stream or trace spans to enter (CPU, no tracer)."""
        t0 = time.perf_counter()
        self.buffers.pack(b, self.policy.scale(step))
        t1 = time.perf_counter()
        sent = self.policy.communicate(step, b, self.buffers.buffers[b])
        t2 = time.perf_counter()
        self.buffers.unpack(b)
        return t1 - t0, t2 - t1, time.perf_counter() - t2, sent


class ProgressThread:
    """The progress thread and the state it shares with the caller (see the module docs)."""

    def __init__(self, state: StepState, runner: BucketRunner, policy: Policy, name: str):
        self.runner, self.policy = runner, policy
        self.buckets = len(state.ready)

        # -- shared with the caller's thread, guarded by cv
        self.cv = threading.Condition()
        #: this step's state; wait() swaps in a fresh one once every bucket is done
        self.state = state
        #: what stopped the thread, handed to the caller by raise_error()
        self.error: BaseException | None = None
        #: close() asked the thread to end
        self.closing = False
        #: the policy's after_step() is running
        self.background = False

        self._thread = background_thread(self._loop, name)

    def start(self) -> None:
        self._thread.start()

    # -- called by the gradient hooks and wait(), holding cv

    def arrived(self, b: int, key: int, now: float) -> bool:
        """Parameter ``key`` (its id) of bucket ``b`` got its gradient at ``now``; hand the
        bucket over once it is complete. True when this is the step's first gradient."""
        state = self.state
        state.seen.add(key)
        first = state.first_grad_t is None
        if first:
            state.first_grad_t = now
        state.last_grad_t = now
        state.missing[b] -= 1
        if state.missing[b] == 0:
            self.mark_ready(b)
        return first

    def mark_ready(self, b: int) -> None:
        """Bucket ``b`` may leave (complete, or given up on at wait())."""
        runner = self.runner
        if runner.cuda:  # the transport's stream waits for what backward enqueued so far
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(runner.comm.device))
            self.state.ready_events[b] = ev
        if runner.tracer is not None:
            runner.tracer.instant(f"commrt/bucket{b}/ready", bucket=b)
        self.state.ready[b] = True
        self.cv.notify_all()

    def _next_bucket(self) -> tuple[int, int, object] | None:
        """Block until the next bucket is ready; (bucket, step, ready event), None at close
        or once the program ended with no bucket ready (never closed)."""
        with self.cv:
            while not self.closing and not (
                self.state.next < self.buckets and self.state.ready[self.state.next]
            ):
                if not idle_wait(self.cv):
                    return None
            if self.closing:
                return None
            s = self.state
            return s.next, s.step, s.ready_events[s.next]

    def _loop(self) -> None:
        if self.runner.cuda:
            # a new thread's current device is 0: without this, leaving the transport's stream
            # restores device 0's and creates a CUDA context on GPU 0 for every rank
            try:
                torch.cuda.set_device(self.runner.comm.device)
            except BaseException as e:  # handed to wait(), as the loop's errors are
                with self.cv:
                    self.error = e
                    self.cv.notify_all()
                return
        while (job := self._next_bucket()) is not None:
            b, step, ready_event = job
            last = b == self.buckets - 1
            try:
                if b == 0:
                    self.policy.begin_step(step)
                pack_s, comm_s, unpack_s, sent = self.runner.run(step, b, ready_event)
                with self.cv:
                    cur = self.state.cur
                    cur.pack_s += pack_s
                    cur.comm_s += comm_s
                    cur.unpack_s += unpack_s
                    cur.bytes_sent += sent
                    self.state.next += 1
                    self.state.done += 1
                    # set with the last bucket's completion, so that no collective can slip in
                    # between wait() returning and the policy's after-step work
                    self.background = last
                    self.cv.notify_all()
                if last:
                    with self.runner.span("commrt/after_step", -1):
                        sent = self.policy.after_step(step)
                    with self.cv:
                        # wait() may have begun the next step: its stats take these bytes
                        self.state.cur.bytes_sent += sent
                        self.background = False
                        self.cv.notify_all()
            except BaseException as e:  # handed to wait(); the thread stops
                with self.cv:
                    self.error = e
                    self.background = False
                    self.cv.notify_all()
                return

    def raise_error(self) -> None:
        """Raise what stopped the thread (caller holds cv), as a CommError."""
        err = self.error
        if isinstance(err, CommError):
            raise err
        raise CommError(
            f"commrt: gradient sync failed in bucket {self.state.next}: {err!r}"
        ) from err

    def wait_done(self, timeout_s: float, rank: int, algorithm: str) -> None:
        """Block until every bucket of the step is done (caller holds cv), then order the
        caller's CUDA stream after them; raise the thread's error, or CommTimeoutError
        after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.state.done < self.buckets and self.error is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeoutError(
                    rank=rank,
                    peer=None,
                    what="gradient buckets",
                    timeout_s=timeout_s,
                    algorithm=algorithm,
                    bucket=self.state.next,
                )
            # capped: wait()'s backstop is the timeout times the buckets, and a wait past
            # TIMEOUT_MAX overflows time_t (the loop waits again until the deadline)
            self.cv.wait(min(left, threading.TIMEOUT_MAX))
        if self.error is not None:
            self.raise_error()
        runner = self.runner
        if runner.cuda and runner.done_event is not None:
            torch.cuda.current_stream(runner.comm.device).wait_event(runner.done_event)

    def quiesce(self, timeout_s: float, rank: int, algorithm: str) -> None:
        """Block until the policy's after-step work is done."""
        if not self.background:
            return
        deadline = time.monotonic() + timeout_s
        with self.cv:
            while self.background and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeoutError(
                        rank=rank,
                        peer=None,
                        what="after-step work",
                        timeout_s=timeout_s,
                        algorithm=algorithm,
                    )
                self.cv.wait(left)
            if self.error is not None:
                self.raise_error()

    def stop(self, timeout_s: float) -> bool:
        """Ask the thread to end and join it; False if it was already stopping."""
        with self.cv:
            if self.closing:
                return False
            self.closing = True
            self.cv.notify_all()
        self._thread.join(timeout=timeout_s)
        return True
