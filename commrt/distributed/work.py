"""Work objects and the call thread of commrt's process group.

Every collective of a group runs on that group's call thread
(:class:`CallQueue`), one at a time in the order the caller issued them (so
every rank runs them in the same order, whatever waits for what). The
caller gets a :class:`CommrtWork` at once; the call thread completes its
future when the collective is done. A synchronous call (``async_op=False``,
``asyncOp=False``) is simply waited on before the call returns. A call its
caller would only wait for (a synchronous one, one inside backward that is
small or made where each rank has one core: :mod:`commrt.distributed.dispatch`),
on the CPU or on CUDA, runs on the caller's thread instead when nothing is
queued before it (:meth:`CallQueue.submit`): the same code, in the same
order, without the hand-off's two thread switches, its event and the group's
stream.

CUDA calls: current streams and the current device are per thread. So the
call thread sets the group's device itself (``torch.cuda.set_device``, once:
without it a stream context left on that thread restores device 0's stream,
and every rank makes a context on GPU 0) and makes a stream of the group's
own its current stream. A call's work waits on that stream for an event
recorded on the *caller's* current stream when the call was made
(:func:`caller_event`): what the caller enqueued before the call (a side
stream included) is done before the collective reads its tensors, and
nothing the caller enqueued after it. (On the default stream, which every
thread shares, the call would also wait for all the compute queued between
the call and the moment the call thread ran it: the backward it should
overlap.) The other way, ``wait()`` and the future order the caller's streams
after the group's stream, as torch's CUDA works do.

Errors: torch 2.13 crashes (segfault) when a Python future that carries an
exception reaches DDP's C++ all-reduce path, so an error never travels in a
future. Instead:

* a caller blocked in :meth:`CommrtWork.wait` (every synchronous call,
  ``work.wait()`` on an asynchronous one) gets commrt's named error raised
  from ``wait()``;
* an error that nobody waits for (DDP's gradient all-reduce only ever
  holds the future) ends the whole job through commrt's abort path
  (:func:`commrt.diagnosis.abort.end_job_after`, after the stall verdict), the error printed with rank, peer and
  algorithm. With ``COMMRT_ABORT_ON_ERROR=0`` the future carries it instead
  (safe for Python consumers such as communication hooks, not for DDP).

After a communication failure the group is broken: later calls raise the first
error. Bad input (ValueError, TypeError, NotImplementedError, a call the
ranks disagree on) leaves it usable.
"""

from __future__ import annotations

import contextlib
import datetime
import queue
import textwrap
import threading
import time

import torch

from commrt import settings
from commrt.diagnosis.abort import abort_on_error_wanted, end_job_after
from commrt.diagnosis.verdict import wrap
from commrt.distributed.torch_api import Work
from commrt.errors import CommError, CommTimeoutError
from commrt.process.threads import background_thread, next_job

#: errors raised before anything reached the wire (bad input, a call the ranks disagree on,
#: raised on every rank alike): the group stays usable after them; any other breaks it
LOCAL_ERRORS = (ValueError, TypeError, NotImplementedError)
WAIT_SLACK_S = settings.Seconds(
    30.0,
    "what `Work.wait()` allows beyond the group's timeout (the collective itself times out first)",
    "the torch.distributed backend",
    settings.TIMEOUT,
)


class CallState:
    """What a :class:`CommrtWork` knows of its call. It lives in one attribute of the work,
    ``commrt``, rather than in attributes of the work itself: ``Work`` is torch's class,
    and a release may take over any name (torch 2.14 made ``timeout`` a read-only
    property, which the old ``self.timeout`` broke on), so the work's own attributes stay
    out of its namespace (:mod:`commrt.distributed.torch_api`)."""

    def __init__(self, what: str, rank: int, result, timeout_s: float, devices=()):
        self.what, self.rank, self.timeout_s = what, rank, timeout_s
        self.result = result  # what the future holds: a list of tensors
        # a CUDA future records the call thread's streams when its result is set, and orders
        # the streams of whoever waits on it after them
        self.cuda = bool(devices)
        self.future = torch.futures.Future(devices=list(devices)) if devices else None
        if self.future is None:
            self.future = torch.futures.Future()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.waited = False  # someone is (or was) blocked in wait(): errors go there
        # a point-to-point call's (P2PWork): what completes it, the thread that completes
        # it for get_future(), and what it tells once complete (its seconds: the stats)
        self.exchange = None
        self.helper: threading.Thread | None = None
        self.completed = lambda seconds: None
        self.started = 0.0


class CommrtWork(Work):
    """One call's completion: ``wait()``, ``get_future()``, ``is_completed()``."""

    def __init__(self, what: str, rank: int, result, timeout: float, devices=()):
        super().__init__()
        self.commrt = CallState(what, rank, result, timeout, devices)  # torch_api.WORK_STATE

    def mark_waited(self) -> None:
        """Someone waits (or will wait) on this work: an error goes to that wait rather
        than ending the job (module docs)."""
        with self.commrt.lock:
            self.commrt.waited = True

    # -- the caller's side
    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        state = self.commrt
        self.mark_waited()
        limit = state.timeout_s + WAIT_SLACK_S
        if timeout is not None and timeout.total_seconds() > 0:  # C++ passes 0: no timeout
            limit = timeout.total_seconds()
        if not state.done.wait(limit):
            raise CommTimeoutError(rank=state.rank, peer=None, what=state.what, timeout_s=limit)
        if state.error is not None:
            raise state.error
        if state.cuda:
            state.future.wait()  # the caller's current streams wait for the call thread's
        return True

    def get_future(self) -> torch.futures.Future:
        return self.commrt.future

    def is_completed(self) -> bool:
        return self.commrt.done.is_set()

    def is_success(self) -> bool:
        return self.commrt.done.is_set() and self.commrt.error is None

    def exception(self):
        return self.commrt.error

    # -- the call thread's side
    def finish(self) -> None:
        self.commrt.future.set_result(self.commrt.result)
        self.commrt.done.set()

    def fail(self, error: BaseException) -> None:
        """Hand ``error`` to a waiter, or end the job when there is none (module docs)."""
        state = self.commrt
        with state.lock:
            state.error = error
            waited = state.waited
            state.done.set()
        if waited:
            return
        if abort_on_error_wanted():
            # the error's text may end in the stall verdict's block: it goes on lines of
            # its own, after the line that says why this rank ends the job
            said = textwrap.fill(
                f"commrt: rank {state.rank}: {state.what} failed and nothing waits for it "
                "(DDP holds only its future); ending the whole job (COMMRT_ABORT_ON_ERROR=0 "
                "hands the error to the future instead):",
                80,
                subsequent_indent="    ",
            )
            text = f"{type(error).__name__}: {error}".splitlines()  # each line within 80
            end_job_after(error, "\n".join([said, *(x for line in text for x in wrap(line))]))
        state.future.set_exception(error)


def caller_event(device: torch.device):
    """An event recorded now on the calling thread's current stream of ``device``: the
    call thread's work waits on it (module docs)."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class CallQueue:
    """The group's calls, run one at a time in the order they came: on one thread (the
    call thread, started on first use), or on the caller's own when it may wait and
    nothing is ahead of it (:meth:`submit`)."""

    def __init__(self, name: str):
        self.name = name
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.broken: BaseException | None = None
        self.start_lock = threading.Lock()
        self.device: torch.device | None = None  # the CUDA device the call thread set
        #: the group's own stream on that device, the call thread's current stream
        self.stream = None
        #: calls submitted and not finished (queued, or running on either thread)
        self.pending = 0
        self.count_lock = threading.Lock()
        #: a call runs on its caller's thread; the calls submitted meanwhile wait in
        #: ``held`` and reach the call thread when it ends. So one call runs at a time by
        #: construction, and the communicator's lock is the only one a call takes
        self.here_running = False
        self.held: list = []

    def submit(self, run, work: CommrtWork, device=None, after=None, here=False) -> CommrtWork:
        """Queue ``run()`` (it does the call); the call thread completes ``work`` after
        it. ``device``: the CUDA device the call runs on, which the call thread makes its
        own first; ``after``: what makes the event (:func:`caller_event`) its current
        stream waits on before ``run()``, called now if the call is queued. ``here``: the caller would only wait for the call (a synchronous
        call, or one inside DDP's backward: ``commrt.distributed.dispatch``), so
        when nothing is queued or running it runs on the caller's thread, in the same
        order, without the two thread switches of a hand-off (a small call's latency)."""
        if self.broken is not None:
            err = CommError(
                f"commrt: rank {work.commrt.rank}: {work.commrt.what} refused: this process "
                f"group failed earlier ({type(self.broken).__name__}: {self.broken})"
            )
            work.fail(err)
            return work
        with self.count_lock:  # the order calls take this lock in is the order they run in
            here = here and self.pending == 0
            self.pending += 1
            if here:
                self.here_running = True
            else:  # recorded now, on the caller's stream: the call follows what came before
                item = (run, work, device, None if after is None else after())
                if self.here_running:
                    self.held.append(item)
                else:
                    self._ensure_thread()
                    self.queue.put(item)
        if here:
            try:
                # on the caller's thread its own current stream is the one to follow (the
                # transport orders itself after it and the caller after itself): no event,
                # no stream of the group's, the caller's current device left as it was
                with contextlib.nullcontext() if device is None else torch.cuda.device(device):
                    self._run_one(run, work, None, None)
            finally:
                with self.count_lock:  # what came meanwhile goes to the call thread, in order
                    self.pending -= 1
                    self.here_running = False
                    if self.held:
                        self._ensure_thread()
                        for held in self.held:
                            self.queue.put(held)
                        self.held.clear()
        return work

    def _done(self) -> None:
        with self.count_lock:
            self.pending -= 1

    def _ensure_thread(self) -> None:
        with self.start_lock:
            if self.thread is None:
                self.thread = background_thread(self._loop, self.name)
                self.thread.start()

    def _loop(self) -> None:
        while True:
            item = next_job(self.queue)  # None also once the program ended (never closed)
            if item is None:
                return
            self._run_one(*item)
            self._done()

    def _run_one(self, run, work: CommrtWork, device, after) -> None:
        """One call, on whichever thread runs it: ``run()``, then complete ``work``."""
        if self.broken is not None:
            work.fail(CommError(f"commrt: {work.commrt.what} refused: the group failed earlier"))
            return
        try:
            if device is not None:
                self._enter(device, after)
            with torch.no_grad():  # torch's groups copy into tensors whatever autograd says
                run()
        except BaseException as e:  # noqa: BLE001 - every error must reach someone
            if not isinstance(e, LOCAL_ERRORS):
                self.broken = e
            work.fail(e)
            return
        work.finish()

    def _enter(self, device: torch.device, after) -> None:
        """On the call thread: make ``device`` and a stream of the group's own on it current
        (once), and order that stream after ``after`` (module docs)."""
        if device != self.device:
            torch.cuda.set_device(device)
            self.stream = torch.cuda.Stream(device)
            torch.cuda.set_stream(self.stream)
            self.device = device
        if after is not None:
            self.stream.wait_event(after)

    def close(self, timeout: float = 5.0) -> None:
        if self.thread is not None and self.thread.is_alive():
            self.queue.put(None)
            self.thread.join(timeout)


class P2PWork(CommrtWork):
    """A send or receive: started at once on the caller's thread (point-to-point calls
    pair with the peer's, not with the group's order), completed by ``wait()``, or for
    ``get_future()`` by a helper thread that waits for it."""

    def __init__(self, what: str, rank: int, result, timeout: float, exchange, completed=None):
        """``completed(seconds)`` is told, once, how long the call took from its start to
        its completion (:meth:`commrt.distributed.observe.Observer.p2p`)."""
        super().__init__(what, rank, result, timeout)
        self.commrt.exchange, self.commrt.started = exchange, time.monotonic()
        if completed is not None:
            self.commrt.completed = completed

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self.mark_waited()
        if not self.commrt.done.is_set():
            self._complete()
        if self.commrt.error is not None:
            raise self.commrt.error
        return True

    def _complete(self) -> None:
        state = self.commrt
        with state.lock:
            if state.done.is_set():
                return
            try:
                state.exchange.complete()
                state.completed(time.monotonic() - state.started)
            except BaseException as e:  # noqa: BLE001 - named commrt errors, to the waiter
                state.error = e
                state.done.set()
                if not state.waited:
                    state.future.set_exception(e)
                return
        self.finish()

    def get_future(self) -> torch.futures.Future:
        state = self.commrt
        with state.lock:
            if state.helper is None and not state.done.is_set():
                # in gloo's wait until the call completes: held by the exit (threads.py)
                state.helper = background_thread(self._complete, "commrt-p2p-wait")
                state.helper.start()
        return state.future
