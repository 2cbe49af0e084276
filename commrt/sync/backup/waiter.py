"""gloo waits that end once a peer is recorded dead (a hung member: :mod:`.wire`'s docs).

gloo cannot be waited on in slices: a wait that times out closes the connection to
that peer for good ("Application timeout caused pair closure"), so a loop of short
waits that looks at something between them breaks the pair it waits on. Here the
wait runs whole, on a thread, and the caller looks between slices of its own.

Example::

    >>> import time
    >>> from commrt.sync.backup.waiter import Waiter
    >>> w = Waiter()
    >>> w.wait(lambda: (time.sleep(0.01), True)[1], gone=lambda: False)
    True
    >>> w.stop()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Sequence

from commrt import settings
from commrt.process.threads import background_thread, next_job
from commrt.transports.base import Forwarding, ForwardingPending, Pair, Pending, Transport

SLICE_S = settings.Seconds(
    0.05,
    "how often a waiting caller asks whether a member was recorded dead",
    "backup workers' reductions",
    settings.POLLING,
)


class MemberRecordedDead(RuntimeError):
    """A wait was given up: a member of the round was recorded dead (it hung, or died
    without its connections closing). An engine error: the reduction redoes the step."""


class Waiter:
    """One thread that runs blocking waits for a caller that polls them.

    A :func:`~commrt.process.threads.background_thread`: a wait given up on is still inside
    gloo, so the interpreter's exit waits for it (at most until that wait's deadline); an
    idle waiter ends by itself once the main thread is done."""

    def __init__(self):
        self.stuck = False  # a wait was given up on and may still be running
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = background_thread(self._serve, "commrt-wire-wait")
        self._thread.start()

    def _serve(self) -> None:
        while True:
            job = next_job(self._jobs)  # None also once the program ended (never closed)
            if job is None:
                return
            fn, done, out = job
            try:
                out.append(fn())
            except BaseException as e:  # handed to the caller, who raises it
                out.append(e)
            done.set()

    def wait(self, fn: Callable[[], bool], gone: Callable[[], bool], slice_s=SLICE_S) -> bool:
        """``fn()`` (a blocking wait) on the thread; its result, or its error raised here.
        Raises :class:`MemberRecordedDead` as soon as ``gone()`` (asked every ``slice_s``)
        while it runs: ``fn`` then goes on alone, its result is dropped, and this waiter is
        ``stuck`` until it ends (a caller that waits again makes another)."""
        done, out = threading.Event(), []
        self._jobs.put((fn, done, out))
        while not done.wait(slice_s):
            if gone():
                self.stuck = True
                raise MemberRecordedDead("a member of the round was recorded dead during a wait")
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    def stop(self) -> None:
        """End the thread once its current wait is over (never joined here)."""
        self._jobs.put(None)


class WaiterSlot:
    """The :class:`Waiter` a caller's successive waits run on; a new one after a wait was
    given up on (the old one ends once that wait does)."""

    def __init__(self):
        self._waiter: Waiter | None = None

    def get(self) -> Waiter:
        if self._waiter is None or self._waiter.stuck:
            self.close()
            self._waiter = Waiter()
        return self._waiter

    def close(self) -> None:
        """End the thread (once its wait, if any, is over)."""
        if self._waiter is not None:
            self._waiter.stop()
        self._waiter = None


class _WaiterPending(ForwardingPending):
    def __init__(self, inner: Pending, waiters: WaiterSlot, gone: Callable[[], bool]):
        super().__init__(inner)
        self.waiters, self.gone = waiters, gone

    def wait_recv(self, i: int, deadline: float) -> bool:
        return self.waiters.get().wait(lambda: self.inner.wait_recv(i, deadline), self.gone)

    def wait_send(self, i: int, deadline: float) -> bool:
        return self.waiters.get().wait(lambda: self.inner.wait_send(i, deadline), self.gone)


class WaiterTransport(Forwarding):
    """``inner`` (a gloo group) whose waits give up once ``gone()`` (module docs)."""

    def __init__(self, inner: Transport, gone: Callable[[], bool]):
        super().__init__(inner)
        self.gone = gone
        self.waiters = WaiterSlot()

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        return _WaiterPending(self.inner.exchange(sends, recvs, tag), self.waiters, self.gone)

    def abort(self) -> None:
        self.inner.abort()
        self.waiters.close()

    def close(self) -> None:
        self.inner.close()
        self.waiters.close()
