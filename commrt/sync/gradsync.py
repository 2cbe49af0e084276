"""GradientSync: average gradients across ranks while backward is still running.

How a step flows:

1. backward produces gradients in reverse registration order; a
   post-accumulate-grad hook marks each parameter ready;
2. when every parameter of a bucket is ready, the bucket is handed to one
   progress thread, which takes buckets strictly in bucket order (so every
   rank issues the same sequence of messages), packs the gradients into the
   bucket's flat buffer (scaled and cast to ``comm_dtype`` in one kernel
   pass), hands it to the algorithm family's :class:`~commrt.sync.policy.Policy`
   (an all-reduce family averages it; see :mod:`commrt.sync.policy` for
   the hooks and when they run) and unpacks the result back into ``.grad``
   (:mod:`commrt.sync.progress`, :mod:`commrt.sync.buffers`);
3. :meth:`GradientSync.wait` blocks only for buckets still in flight.

On a GPU the same thread enqueues pack, NCCL calls and unpack on the
transport's dedicated CUDA stream, ordered after backward by an event
recorded when the bucket became ready; ``wait()`` then orders the caller's
stream after that stream (and blocks the host only as long as needed).

Unused parameters: a parameter that got no gradient in a step (an unused
branch) would leave its bucket incomplete forever. At ``wait()`` such
parameters are reduced as zeros (``unused="zeros"``, the default, DDP's
``find_unused_parameters`` behaviour): the others' gradients still average
in, and the parameter's ``.grad`` is set to that average, so every rank
keeps identical parameters. With ``unused="error"`` the bucket is still
reduced (so other ranks never hang), then every rank learns, in one small
exchange, which ranks skipped which parameters, and ``wait()`` raises
ValueError naming them on every rank, before any rank's optimizer step.

Same start: at construction every rank takes rank 0's parameters and
buffers (as DDP does), so a script that seeds nothing still trains one
model; ``broadcast_buffers=True`` also re-sends rank 0's buffers (BatchNorm
statistics, say) after every ``step()``.

What a tool may ask whatever the family (may ranks fail? is this rank
done? which rows for a summary?) is :meth:`GradientSync.report`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch

from commrt.algorithms import DEFAULT_ALGORITHM, Algorithm
from commrt.errors import api_boundary, named_keywords
from commrt.runtime.communicator import Communicator
from commrt.runtime.trace import Tracer
from commrt.sync.buckets import MB, Bucket, assign_buckets, check_layout, describe
from commrt.sync.buffers import BucketBuffers
from commrt.sync.config import SyncConfig, trainable
from commrt.sync.families import policy_for
from commrt.sync.grad_ready import GradReadyHooks
from commrt.sync.join import joined
from commrt.sync.model_state import broadcast_state
from commrt.sync.policy import SyncContext
from commrt.sync.progress import BucketRunner, ProgressThread
from commrt.sync.recording import StepRecorder
from commrt.sync.report import SyncReport
from commrt.sync.stats import SyncStats
from commrt.sync.step_state import StepState
from commrt.sync.unused import Unused, raise_if_unused, unready_parameters

__all__ = ["GradientSync", "Unused"]


@named_keywords
class GradientSync:
    """Bucketed, overlapped gradient averaging for a custom training loop.

    Args:
        model: the module whose parameters (those with ``requires_grad``)
            are synchronised; every rank must build the same model.
        comm: a :class:`~commrt.Communicator` from :func:`commrt.init`.
        algorithm: name or :class:`~commrt.algorithms.Algorithm` instance
            (default :data:`commrt.algorithms.DEFAULT_ALGORITHM`); its family's policy
            (:func:`commrt.sync.families.policy_for`) decides what each bucket does (an
            all-reduce averages it).
        bucket_mb: bucket cap in MB of wire bytes (default 25, as DDP).
        first_bucket_mb: cap of the first bucket, small so communication
            starts early (default 1).
        comm_dtype: wire dtype (fp32, fp16 or bf16); default: the
            gradients' dtype. bf16 halves the bytes; reductions still add
            in fp32 (one rounding per addition).
        unused: ``"zeros"`` or ``"error"``, see the module docs.
        grad_views: let each ``.grad`` live inside a flat bucket buffer in
            the parameters' dtype (as DDP's ``gradient_as_bucket_view``):
            backward accumulates straight into it, and no second copy of the
            gradients exists. Where the wire dtype is the parameters', packing
            is an in-place scale and unpacking nothing; where it differs, one
            flat cast each way. Applies to buckets whose parameters share one
            dtype; ``step()`` then
            zeroes gradients in place instead of setting them to None (a
            gradient set to None or replaced is copied in and re-viewed).
        trace: ``True`` or a :class:`~commrt.runtime.trace.Tracer` to record a
            Chrome-trace timeline (``save_trace``); NVTX ranges on GPU.
        broadcast_init: start every rank from rank 0's parameters and
            buffers (default True, as DDP). Turn it off only if the ranks
            already agree (the broadcast then costs one model's worth of
            traffic at construction for nothing).
        broadcast_buffers: after every ``step()``, overwrite the model's
            buffers with rank 0's (one broadcast per step; DDP does this
            before every forward by default). Default False: buffers then
            evolve per rank, which is what BatchNorm statistics of a model
            evaluated on rank 0 usually want anyway.

    Example::

        sync = commrt.GradientSync(model, comm, comm_dtype=torch.bfloat16)
        for x, y in loader:
            loss_fn(model(x), y).backward()   # buckets leave while backward runs
            sync.step(optimizer)              # wait, optimizer.step(), zero_grad()

    Shards of different lengths (:meth:`join`)::

        with sync.join(optimizer):            # on every rank
            for x, y in my_shard:             # ranks out of data shadow the rest
                loss_fn(model(x), y).backward()
                sync.step(optimizer)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        comm: Communicator,
        algorithm: "str | Algorithm" = DEFAULT_ALGORITHM,
        bucket_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        comm_dtype: torch.dtype | None = None,
        *,
        unused: "str | Unused" = "zeros",
        grad_views: bool = True,
        trace: "bool | Tracer" = False,
        broadcast_init: bool = True,
        broadcast_buffers: bool = False,
    ):
        flags = dict(unused=unused, grad_views=grad_views)
        flags.update(broadcast_init=broadcast_init, broadcast_buffers=broadcast_buffers)
        cfg = SyncConfig.from_args(
            model, comm, algorithm, bucket_mb, first_bucket_mb, comm_dtype, **flags
        )
        named = trainable(model)

        # -- what was asked for (validated, never changes)
        self.config = cfg
        self.comm, self.model = comm, model
        self.algorithm, self.comm_dtype, self.unused = cfg.algorithm, cfg.comm_dtype, cfg.unused
        self.broadcast_buffers = cfg.broadcast_buffers

        # -- buckets and their wire buffers (every rank checked to agree, and to start alike)
        self.policy = policy_for(cfg.algorithm)
        self.buckets: list[Bucket] = _agreed_buckets(cfg, named, comm, model, self.policy)
        self.io = BucketBuffers(self.buckets, cfg.comm_dtype, comm.device, cfg.grad_views)
        self._buffers, self._views = self.io.buffers, self.io.views  # (tests look inside)

        # -- the family's policy, and what is recorded about each step
        self.tracer = _tracer(trace, comm)
        bufs, buckets = tuple(self._buffers), tuple(self.buckets)
        ctx = SyncContext(comm, buckets, bufs, cfg.comm_dtype, self.tracer, self.io.unpack)
        self.stats = _fresh_stats(self.policy.setup(ctx), named, comm)
        self._recorder = StepRecorder(self.stats, self.tracer)

        # -- the progress thread, and the step state it shares with the hooks and wait()
        runner = BucketRunner(self.io, self.policy, comm, self.tracer)
        first, name = StepState.fresh(self.buckets, 0), f"commrt-progress-r{comm.rank}"
        self._progress = ProgressThread(first, runner, self.policy, name=name)
        #: optimizer updates step() applied
        self._updates = 0

        # -- the gradient hooks (autograd calls them as each .grad is accumulated)
        self.hooks = GradReadyHooks(self, self.buckets, self._progress, comm, named)
        comm.syncs.register(self)
        self._progress.start()

    # -- the API
    @api_boundary
    def wait(self) -> None:
        """Block until every bucket is reduced and unpacked into ``.grad``.

        Parameters that got no gradient this step are reduced as zeros (see
        ``unused``). Raises :class:`~commrt.CommTimeoutError` if the step
        does not finish in time, naming the rank, peer, algorithm, step and
        bucket of the wait that expired.
        """
        _check_open(self._progress, "wait()")
        if self.hooks.accumulating:
            raise RuntimeError("commrt: wait() inside no_sync(): leave the no_sync block first")
        t_wait, wait_us = self._recorder.now()
        with self._progress.cv:
            state = self._progress.state
            self.comm.syncs.begin_step(self)  # also a step in which no gradient arrived
            unused = unready_parameters(self.buckets, state, self._progress.mark_ready)
            # each bucket's own waits (and the previous step's after-step work) are bounded
            # by comm.timeout per schedule step; this is the backstop
            backstop = self.comm.timeout * (len(self.buckets) + 2)
            self._progress.wait_done(backstop, self.comm.rank, self.algorithm.name)
            self._record(state, t_wait, wait_us)
            # the one place a step's state is reset
            self._progress.state = StepState.fresh(self.buckets, state.step + 1)
            self.comm.syncs.end_step(self)
        if self.unused is Unused.ERROR:
            raise_if_unused(self.comm, self.buckets, unused)

    def _record(self, state: StepState, t_wait: float, wait_us: float) -> None:
        # the finished step into stats and the trace
        memory = self.io.extra_bytes + self.policy.extra_bytes + self.comm.executor.scratch_bytes()
        self._recorder.waited(state, t_wait, time.perf_counter(), self.policy.step_stats(), memory)
        self._recorder.trace_wait(state, t_wait, wait_us)

    @api_boundary
    def step(self, optimizer: torch.optim.Optimizer, zero_grad: bool = True) -> int:
        """``wait()``, then ``optimizer.step()``, then ``optimizer.zero_grad()``

        (in place, ``set_to_none=False``, when gradients live in the bucket
        buffers; see ``grad_views``). Returns the number of updates applied
        (1, except for families that may apply none or several, such as
        a late worker catching up)."""
        self.wait()
        applied = self.policy.apply(optimizer)
        self._updates += applied
        if self.broadcast_buffers:
            broadcast_state(self.model, self.comm, parameters=False)
        if zero_grad:
            # gradients that live in bucket buffers are zeroed in place, so they stay there
            optimizer.zero_grad(set_to_none=not self.io.any_views)
        self._recorder.optimized()
        return applied

    @property
    def global_step(self) -> int:
        """The global step this rank's parameters and optimizer state hold: the updates
        ``step()`` applied, unless the family tracks it itself (a late worker that
        catches up jumps to the latest step)."""
        held = self.policy.global_step
        return self._updates if held is None else held

    @property
    def finished(self) -> bool:
        """This rank has nothing more to do (its family says so): further steps are
        no-ops, so a training loop may stop."""
        return self.policy.finished

    def report(self) -> SyncReport:
        """What this sync did, in terms every family shares (complete after ``close()``):
        may ranks fail, do models drift, is this rank done, the family's summary rows."""
        return SyncReport.of(self.policy, self.stats.algorithms, self.global_step)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after the block syncs them all.

        Example::

            with sync.no_sync():
                loss_fn(model(x1), y1).backward()
            loss_fn(model(x2), y2).backward()
            sync.step(optimizer)
        """
        if self._progress.state.started:
            raise RuntimeError(
                "commrt: no_sync() entered with gradients of this step already "
                "in flight; call sync.wait() first"
            )
        hooks = self.hooks
        prev, hooks.accumulating = hooks.accumulating, True
        try:
            yield
        finally:
            hooks.accumulating = prev

    def join(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager:
        """Uneven inputs, as DDP's ``Join``: a rank that leaves the block (its data ran out)
        shadows the steps the others still run, with zero gradients, until every rank has
        left it; each step averages over the ranks still training, and every rank applies
        it with ``optimizer``, so all end with identical parameters. Every rank must enter
        it (see :mod:`commrt.sync.join` and the class example). ValueError, from the
        family's policy (``Policy.join``) saying why, for families where it does not
        apply."""
        _check_open(self._progress, "join()")
        if self._progress.state.started:
            raise RuntimeError("commrt: join() entered with a step in flight: sync.wait() first")
        return joined(self, self.policy.join(), optimizer)

    def save_trace(self, path: str) -> str:
        """Write this rank's Chrome-trace JSON (needs ``trace=True``)."""
        if self.tracer is None:
            raise RuntimeError("tracing is off: create GradientSync(..., trace=True)")
        return self.tracer.save(path)

    def quiesce(self) -> None:
        """Block until the policy's after-step work is done (before another collective
        on the communicator, which would otherwise interleave with it)."""
        self._progress.quiesce(self.comm.timeout, self.comm.rank, self.algorithm.name)

    @api_boundary
    def close(self) -> None:
        """Finish work in flight, stop the progress thread and remove the hooks. Idempotent."""
        if not self._progress.stop(self.comm.timeout):
            return
        self.hooks.remove()
        self.comm.syncs.unregister(self)
        self.policy.close()

    def __enter__(self) -> "GradientSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GradientSync({describe(self.buckets, self._buffers[0].element_size())}, "
            f"algorithm={self.algorithm.name}, comm_dtype={self.comm_dtype}, "
            f"rank {self.comm.rank}/{self.comm.world_size})"
        )


def _check_open(progress: ProgressThread, call: str) -> None:
    # after close() no hook sends a bucket and no thread reduces one: a wait would only
    # run into its backstop timeout
    if progress.closing:
        raise RuntimeError(
            f"commrt: {call} on a closed GradientSync (sync.close() or its with-block "
            "ended): create a new one to synchronise gradients again"
        )


def _fresh_stats(algorithms, named, comm: Communicator) -> SyncStats:
    """The statistics of a GradientSync whose policy set up ``algorithms`` for its
    buckets, over the trainable ``named`` parameters."""
    return SyncStats(
        algorithms=tuple(algorithms),
        grad_bytes=sum(p.numel() * p.element_size() for _, p in named),
        rank=comm.rank,
        world_size=comm.world_size,
        transport=comm.transport_text,
    )


def _agreed_buckets(cfg: SyncConfig, named, comm, model, policy) -> list[Bucket]:
    """The buckets, checked to be laid out alike on every rank; every rank then starts
    from rank 0's weights (if asked). A replacement that rejoined a running job does
    neither: the others are past these collectives, and its policy brings the state."""
    buckets = assign_buckets(
        named, int(cfg.bucket_mb * MB), int(cfg.first_bucket_mb * MB), cfg.element_size
    )
    if comm.transport.traits.rejoined:
        if not policy.can_rejoin:
            raise ValueError(
                f"commrt: this process rejoined a running job (COMMRT_REJOIN=1), which "
                f"algorithm {cfg.algorithm.name!r} does not allow: its policy cannot take "
                "a replacement in (README: 'Restarting a dead worker')"
            )
        return buckets
    check_layout(comm, buckets, extra=f"{cfg.comm_dtype}|{cfg.algorithm!r}")
    if cfg.broadcast_init:
        broadcast_state(model, comm)
    return buckets


def _tracer(trace: "bool | Tracer", comm) -> Tracer | None:
    """The tracer asked for: the caller's own, a new one (NVTX ranges on GPU), or none."""
    if isinstance(trace, Tracer):
        return trace
    return Tracer(comm.rank, nvtx=comm.device.type == "cuda") if trace else None
