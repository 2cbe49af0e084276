"""Runs any :class:`~commrt.schedule.Schedule` on a flat tensor over any transport.

For one rank the schedule is compiled once per (buffer length, element
size, piece size) into a :class:`Plan`: element ranges per step, each large
range cut into *pieces* of at most ``piece_bytes``. Each piece is its own
message, so the reduction of piece ``i`` runs while pieces ``i+1..`` are
still arriving (and the reduced data is still in cache). Reductions land in
a scratch buffer first and are added in by :func:`commrt.kernels.reduce_`
(fp32/fp16/bf16; ``add_`` for float64 and integers);
copies go straight into place when no send of the same step reads there.

bf16 and fp16 buffers are reduced with fp32 arithmetic (each addition is
computed in fp32 and rounded once to the buffer's dtype); partial sums
travel in the buffer's dtype.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from commrt.errors import CommError, CommTimeoutError, PeerClosedError, PeerFailedError
from commrt.schedule import Schedule
from commrt.schedule.bound import Bound, default_reduce
from commrt.schedule.caches import Bindings, Run, SettledCalls, piece_elems
from commrt.schedule.p2p import Where, engine_error, timeout_error
from commrt.schedule.plan import StepPlan
from commrt.schedule.position import Position
from commrt.transports.base import Prepared, Transport


class Executor:
    """Runs schedules on the bindings its :class:`~commrt.schedule.caches.Bindings`
    keeps: compiled plans, bindings and one scratch buffer per dtype/device (each cache's
    key, bound and lifetime: :mod:`commrt.collectives`).

    ``reduce``: what a received piece meets unless a run names its own (default: a sum).
    Not thread-safe by itself: the :class:`~commrt.Communicator` lock
    serialises collectives.
    """

    def __init__(self, reduce: Callable[[torch.Tensor, torch.Tensor], object] | None = None):
        self.reduce = reduce or default_reduce
        #: plans, bindings, scratch and the memo of the last call
        self.bindings = Bindings(self.reduce)
        #: the settled calls by signature: the memo's one owner (callers ask it)
        self.settled = SettledCalls(self.bindings)
        self._ran: Schedule | None = None  # the last run's schedule, cached or not
        #: where this rank is (commrt.schedule.position): what the stall watch samples
        self.position = Position()

    @property
    def last_schedule(self) -> Schedule | None:
        """The last run's schedule (None before any): what its caller reports ran."""
        return self._ran

    @property
    def last(self) -> Run | None:
        """The last cached binding run, with the call that ran it, or None
        (:attr:`commrt.schedule.caches.Bindings.memo`). A caller that finds its own call
        there runs it with :meth:`repeat`."""
        return self.bindings.memo

    def scratch_bytes(self) -> int:
        """Bytes of scratch memory held for receives (kept between calls)."""
        return self.bindings.scratch_bytes()

    def release(self) -> None:
        """Drop cached scratch memory and bindings (re-made on next use)."""
        self.bindings.release()

    def warm(self, schedule: Schedule, rank: int, buf: torch.Tensor, piece_bytes: int) -> int:
        """Launch the reduce once per distinct piece size ``schedule`` will sum into ``buf``,
        on zeros of their own: on CUDA the first launch of a configuration
        (:func:`commrt.kernels.configs.launch_config`) and dtype compiles the kernel, which
        must not happen on the progress thread during the first backward. Returns the
        number of launches."""
        plan = self.bindings.plan(schedule, rank, buf.numel(), piece_elems(piece_bytes, buf))
        sizes = sorted({x.stop - x.start for st in plan.steps for x in st.recvs if x.reduce})
        for n in sizes:
            dst = torch.zeros(n, dtype=buf.dtype, device=buf.device)
            self.reduce(dst, torch.zeros_like(dst))
        return len(sizes)

    def run(
        self,
        schedule: Schedule,
        buf: torch.Tensor,
        transport: Transport,
        timeout: float,
        piece_bytes: int = 4 << 20,
        reduce: Callable | None = None,
        bucket: int | None = None,
        tracer=None,
        owner: torch.Tensor | None = None,
        spin_s: float = 0.0,
        call=None,
    ) -> int:
        """Run ``schedule`` in place on the contiguous ``buf`` (taken as flat); return the bytes
        this rank sent.

        The arguments may come by position, in this order
        (:meth:`commrt.Communicator.run_schedule` passes them so: a repeated small call
        pays for every keyword argument).
        ``reduce(dst, src)``: what a received piece meets in place of this executor's own
        (``self.reduce``, a sum): a min, a max... (:mod:`commrt.collectives.reductions`).
        An average is not the executor's: its caller scales the buffer by one over the
        ranks before the sum (:mod:`commrt.collectives`).
        Raises :class:`~commrt.CommTimeoutError` if any wait exceeds
        ``timeout`` seconds, naming the rank, peer, algorithm, step and bucket.
        ``spin_s``: how long a wait polls before it yields the core
        (:func:`~commrt.transports.base.poll_until`); for callers that block.
        ``call``: the caller's record of this call, kept with a cached binding
        (:attr:`commrt.schedule.caches.Run.call`).
        """
        run = self.bindings.for_call(schedule, buf, transport, piece_bytes, reduce, owner, call)
        if run.kept:
            return self._run(run, buf, timeout, bucket, tracer, spin_s)
        try:
            return self._run(run, buf, timeout, bucket, tracer, spin_s)
        finally:
            run.bound.free()

    def repeat(self, run: Run, buf, timeout: float, tracer=None, spin_s: float = 0.0) -> int:
        """Run the call of ``run`` again on ``buf``, the buffer it ran on (owner of its
        binding): for a caller that found its call in :attr:`last` and checked ``buf``
        against it, so that nothing is looked up twice. Should another run have come
        between (another thread), the binding is looked up as :meth:`run` would. Returns
        the bytes this rank sent."""
        if run is not self.bindings.memo:  # forgotten once an owner died
            return self.run(
                run.schedule,
                buf,
                run.transport,
                timeout,
                run.piece_bytes,
                run.reduce,
                None,
                tracer,
                buf,
                spin_s,
                run.call,
            )
        return self._run(run, buf, timeout, None, tracer, spin_s)

    def _run(self, run: Run, buf, timeout, bucket, tracer, spin_s) -> int:
        """:meth:`run` on its binding."""
        bound, schedule = run.bound, run.schedule
        self._ran = schedule
        if not bound.member:
            return 0
        pos = self.position  # a few attribute writes: no lock, no clock, no allocation
        pos.run, pos.bucket, pos.runs = run, bucket, pos.runs + 1
        if run.transport.traits.stream_ordered:
            whole = run.transport.runs_whole(schedule, buf, run.reduce)
            return _run_ordered(pos, bound, buf, run.transport, timeout, bucket, tracer, whole)
        return _run_blocking(pos, bound, timeout, bucket, tracer, spin_s)


def _run_blocking(pos: Position, bound: Bound, timeout, bucket, tracer, spin_s: float) -> int:
    """:meth:`Executor.run` on a transport whose waits block: step by step, each step's
    deadline its own."""
    schedule, run_step = bound.schedule, _run_step
    try:
        if tracer is None:
            for step in bound.steps:
                pos.step = step[0]
                run_step(step, time.monotonic() + timeout, schedule, timeout, bucket, spin_s)
        else:
            for step in bound.steps:
                sp = pos.step = step[0]
                with tracer.span(
                    f"commrt/{schedule.name}/step{sp.index}", phase=sp.phase, bucket=bucket
                ):
                    run_step(step, time.monotonic() + timeout, schedule, timeout, bucket, spin_s)
        pos.step = None
    finally:
        if pos.step is not None:  # an error: kept for the verdict, out of the call now
            pos.failed, pos.step = (pos.runs, pos.step), None
    return bound.sent_bytes


def _run_step(
    step, deadline: float, schedule: Schedule, timeout: float, bucket, spin_s: float = 0.0
) -> None:
    """One bound step (:class:`Bound`): start it, wait for each receive (after the sends
    that must leave first) and apply it, then wait for the remaining sends."""
    sp, prepared, post, tail = step
    try:
        pend = prepared.start(spin_s)  # gloo raises here when a peer's connection closed
        sent = 0
        for i, after, apply in post:
            while sent < after:
                if not pend.wait_send(sent, deadline):
                    _timeout(prepared, "send", sp.sends[sent].peer, sp, schedule, timeout, bucket)
                sent += 1
            if not pend.wait_recv(i, deadline):
                _timeout(prepared, "recv", sp.recvs[i].peer, sp, schedule, timeout, bucket)
            if apply is not None:
                apply()
        for j in tail:
            if not pend.wait_send(j, deadline):
                _timeout(prepared, "send", sp.sends[j].peer, sp, schedule, timeout, bucket)
        pend.finish()
    except (PeerClosedError, PeerFailedError) as e:  # a peer that left or failed: say where
        where = Where(schedule.name, sp.index, schedule.num_steps, bucket)
        raise e.at(where.describe()) from None
    except CommError:
        raise
    except RuntimeError as e:  # engine errors (a peer's connection closed, ...)
        where = Where(schedule.name, sp.index, schedule.num_steps, bucket)
        raise engine_error(
            prepared.transport, e, [x.peer for x in sp.sends + sp.recvs], where
        ) from e


def _timeout(
    prepared: Prepared,
    what: str,
    peer: int,
    sp: StepPlan,
    schedule: Schedule,
    timeout: float,
    bucket,
) -> None:
    where = Where(schedule.name, sp.index, schedule.num_steps, bucket)
    raise timeout_error(prepared.transport.rank, what, peer, timeout, where)


def _sync(transport: Transport, timeout: float, bound: Bound, bucket) -> bool:
    """The host's bounded wait for the stream's work; an engine's error meanwhile (a peer's
    process gone while a copy from it still runs) is named as a step's would be."""
    try:
        return transport.sync(time.monotonic() + timeout)
    except CommError:
        raise
    except RuntimeError as e:
        peers = [x.peer for step in bound.steps for x in step[0].sends + step[0].recvs]
        raise engine_error(transport, e, peers, Where(bound.schedule.name, bucket=bucket)) from e


def _run_whole(transport: Transport, buf, timeout: float, bound: Bound, bucket) -> None:
    """The engine's own fused run of the whole schedule; a wait that timed out, or an
    engine's error (a peer's process gone), named as a step's would be."""
    schedule = bound.schedule
    try:
        late = transport.run_whole(buf, time.monotonic() + timeout)
    except CommError:
        raise
    except RuntimeError as e:
        peers = [x.peer for step in bound.steps for x in step[0].sends + step[0].recvs]
        raise engine_error(transport, e, peers, Where(schedule.name, bucket=bucket)) from e
    if late is not None:
        raise CommTimeoutError(
            rank=transport.rank,
            peer=late,
            what="recv",
            timeout_s=timeout,
            algorithm=schedule.name,
            bucket=bucket,
        )


def _run_ordered(
    pos: Position,
    bound: Bound,
    buf: torch.Tensor,
    transport: Transport,
    timeout: float,
    bucket,
    tracer,
    whole: bool = False,
) -> int:
    """:meth:`Executor.run` on a stream-ordered transport: everything is enqueued on its stream
    (``whole``: by the transport itself, :meth:`~commrt.transports.base.Transport.run_whole`)."""
    schedule = bound.schedule
    transport.begin(buf)
    with transport.stream():
        if whole:
            _run_whole(transport, buf, timeout, bound, bucket)
        for step in () if whole else bound.steps:
            pos.step = step[0]  # enqueued: the watchdog's wait names the last
            if tracer is None:
                _run_step(step, time.monotonic() + timeout, schedule, timeout, bucket)
                continue
            sp = step[0]
            with tracer.span(
                f"commrt/{schedule.name}/step{sp.index}", phase=sp.phase, bucket=bucket
            ):
                _run_step(step, time.monotonic() + timeout, schedule, timeout, bucket)
    if not _sync(transport, timeout, bound, bucket):
        raise CommTimeoutError(
            rank=transport.rank,
            peer=None,
            what="device stream",
            timeout_s=timeout,
            algorithm=schedule.name,
            bucket=bucket,
        )
    transport.end(buf)
    pos.step = None
    return bound.sent_bytes
