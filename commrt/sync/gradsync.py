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
   the hooks and when they run) and unpacks
   the result back into ``.grad``;
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
"""
from __future__ import annotations

import contextlib
import enum
import threading
import time
from typing import Iterator

import torch

from commrt.algorithms import DEFAULT_ALGORITHM, Algorithm, resolve
from commrt.collectives import gather_rows
from commrt.comm import Communicator
from commrt.errors import CommError, CommTimeoutError
from commrt.kernels import SUPPORTED_DTYPES, pack, unpack
from commrt.sync.buckets import MB, Bucket, assign_buckets, check_layout
from commrt.sync.families import policy_for
from commrt.sync.policy import SyncContext
from commrt.sync.state import broadcast_state
from commrt.sync.stats import StepStats, SyncStats
from commrt.trace import Tracer


class Unused(enum.Enum):
    ZEROS = "zeros"
    ERROR = "error"


class GradientSync:
    """Bucketed, overlapped gradient averaging for a custom training loop.

    Args:
        model: the module whose parameters (those with ``requires_grad``)
            are synchronised; every rank must build the same model.
        comm: a :class:`~commrt.Communicator` from :func:`commrt.init`.
        algorithm: name or :class:`~commrt.algorithms.Algorithm` instance
            (default :data:`commrt.algorithms.DEFAULT_ALGORITHM`); its family's policy (:func:`commrt.sync.families.policy_for`)
            decides what each bucket does (an all-reduce averages it).
        bucket_mb: bucket cap in MB of wire bytes (default 25, as DDP).
        first_bucket_mb: cap of the first bucket, small so communication
            starts early (default 1).
        comm_dtype: wire dtype (fp32, fp16 or bf16); default: the
            gradients' dtype. bf16 halves the bytes; reductions still add
            in fp32 (one rounding per addition).
        unused: ``"zeros"`` or ``"error"``, see the module docs.
        grad_views: let each ``.grad`` live inside its bucket buffer (as
            DDP's ``gradient_as_bucket_view``): backward accumulates straight
            into the buffer, so packing is an in-place scale and unpacking
            nothing, and no second copy of the gradients exists. Applies to
            buckets whose parameters all have the wire dtype; ``step()`` then
            zeroes gradients in place instead of setting them to None (a
            gradient set to None or replaced is copied in and re-viewed).
        trace: ``True`` or a :class:`~commrt.trace.Tracer` to record a
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
    """

    def __init__(self, model: torch.nn.Module, comm: Communicator, algorithm: "str | Algorithm" = DEFAULT_ALGORITHM,
                 bucket_mb: float = 25.0, first_bucket_mb: float = 1.0, comm_dtype: torch.dtype | None = None,
                 *, unused: "str | Unused" = "zeros", grad_views: bool = True, trace: "bool | Tracer" = False,
                 broadcast_init: bool = True, broadcast_buffers: bool = False):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(comm, Communicator):
            raise TypeError(f"comm must be a commrt.Communicator (from commrt.init), got {type(comm).__name__}")
        comm._check_open()
        for name, v in (("bucket_mb", bucket_mb), ("first_bucket_mb", first_bucket_mb)):
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number of MB, got {v!r}")
        try:
            self.unused = Unused(unused) if not isinstance(unused, Unused) else unused
        except ValueError:
            raise ValueError(f"unused must be 'zeros' or 'error', got {unused!r}") from None
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no parameters that require grad: nothing to synchronise")
        for n, p in named:
            if p.device.type != comm.device.type:
                raise ValueError(f"parameter {n} is on {p.device} but the {comm.backend.value} communicator "
                                 f"works on {comm.device}; move the model first")
            if p.dtype not in SUPPORTED_DTYPES:
                raise ValueError(f"parameter {n} has dtype {p.dtype}; GradientSync handles "
                                 f"{', '.join(map(str, SUPPORTED_DTYPES))}")
        dtypes = {p.dtype for _, p in named}
        if comm_dtype is None:
            comm_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        if comm_dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"comm_dtype must be one of {', '.join(map(str, SUPPORTED_DTYPES))}, got {comm_dtype}")

        self.comm, self.model, self.comm_dtype = comm, model, comm_dtype
        self.algorithm = resolve(algorithm)
        esize = torch.empty((), dtype=comm_dtype).element_size()
        self.buckets: list[Bucket] = assign_buckets(named, int(bucket_mb * MB), int(first_bucket_mb * MB), esize)
        check_layout(comm, self.buckets, extra=f"{comm_dtype}|{self.algorithm!r}")
        if broadcast_init:
            broadcast_state(model, comm)
        self.broadcast_buffers = bool(broadcast_buffers)
        self._buffers = [torch.zeros(b.numel, dtype=comm_dtype, device=comm.device) for b in self.buckets]
        # per bucket: views of its buffer shaped like its parameters, or None (pack/unpack path)
        self._views: list[list[torch.Tensor] | None] = [
            [buf[o:o + p.numel()].view_as(p) for o, p in zip(b.offsets, b.params)]
            if grad_views and all(p.dtype == comm_dtype for p in b.params) else None
            for b, buf in zip(self.buckets, self._buffers)]
        with torch.no_grad():
            for b, views in zip(self.buckets, self._views):
                for p, v in zip(b.params, views or ()):
                    if p.grad is not None:
                        v.copy_(p.grad)
                    p.grad = v
        self._where = {id(p): b.index for b in self.buckets for p in b.params}

        self.tracer = trace if isinstance(trace, Tracer) else (
            Tracer(comm.rank, nvtx=comm.device.type == "cuda") if trace else None)
        self.policy = policy_for(self.algorithm)
        labels = self.policy.setup(SyncContext(comm, tuple(self.buckets), tuple(self._buffers), comm_dtype,
                                               self.tracer))
        self.stats = SyncStats(algorithms=tuple(labels),
                               grad_bytes=sum(p.numel() * p.element_size() for _, p in named))
        self._cuda = comm.device.type == "cuda"
        self._zeros: dict[int, torch.Tensor] = {}

        # step state, guarded by _cv
        self._cv = threading.Condition()
        nb = len(self.buckets)
        self._missing = [len(b.params) for b in self.buckets]
        self._ready = [False] * nb
        self._ready_events: list = [None] * nb
        self._done = 0
        self._next = 0
        self._background = False   # the policy's after_step() is running
        self._seen: set[int] = set()
        self._error: BaseException | None = None
        self._closing = False
        self._accumulating = False
        self._cur = StepStats(step=0, buckets=nb)
        self._first_grad_t: float | None = None
        self._last_grad_t = 0.0
        self._step_start = time.perf_counter()
        self._step_start_us = self.tracer.now_us() if self.tracer else 0.0
        self._done_event = None
        self._updates = 0

        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for _, p in named]
        comm._syncs.add(self)
        self._thread = threading.Thread(target=self._progress, name=f"commrt-progress-r{comm.rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ hooks

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if self._accumulating:
            return
        now = time.perf_counter()
        b = self._where[id(p)]
        with self._cv:
            if self._error is not None:
                raise CommError(f"commrt: gradient sync already failed: {self._error}") from self._error
            if id(p) in self._seen:
                raise RuntimeError(
                    f"commrt: parameter {self.buckets[b].names[self.buckets[b].params.index(p)]} got a second "
                    "gradient before sync.wait(); its bucket may already be on the wire. Call sync.wait() "
                    "(or sync.step()) after each backward, and wrap accumulation steps in sync.no_sync().")
            self._seen.add(id(p))
            if self._first_grad_t is None:
                self._first_grad_t = now
                self.comm._active_sync = self
            self._last_grad_t = now
            self._missing[b] -= 1
            if self._missing[b] == 0:
                self._mark_ready(b)

    def _mark_ready(self, b: int) -> None:
        # caller holds _cv
        if self._cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.comm.device))
            self._ready_events[b] = ev
        if self.tracer is not None:
            self.tracer.instant(f"commrt/bucket{b}/ready", bucket=b)
        self._ready[b] = True
        self._cv.notify_all()

    # -------------------------------------------------------- progress thread

    def _progress(self) -> None:
        nb = len(self.buckets)
        while True:
            with self._cv:
                while not self._closing and not (self._next < nb and self._ready[self._next]):
                    self._cv.wait()
                if self._closing:
                    return
                b, step = self._next, self._cur.step
            last = b == nb - 1
            try:
                if b == 0:
                    self.policy.begin_step(step)
                self._run_bucket(step, b)
                with self._cv:
                    self._next += 1
                    self._done += 1
                    # set with the last bucket's completion, so that no collective can slip in
                    # between wait() returning and the policy's after-step work
                    self._background = last
                    self._cv.notify_all()
                if last:
                    with self._span("commrt/after_step", -1):
                        sent = self.policy.after_step(step)
                    with self._cv:
                        self._cur.bytes_sent += sent
                        self._background = False
                        self._cv.notify_all()
            except BaseException as e:   # handed to wait(); the thread stops
                with self._cv:
                    self._error = e
                    self._background = False
                    self._cv.notify_all()
                return

    def _grads(self, bucket: Bucket, create: bool) -> list[torch.Tensor]:
        out = []
        for name, p in zip(bucket.names, bucket.params):
            g = p.grad
            if g is None:
                if create:   # unpack target for a parameter unused here: it receives the average
                    p.grad = g = torch.zeros_like(p)
                else:
                    g = self._zeros.get(id(p))
                    if g is None:
                        g = self._zeros[id(p)] = torch.zeros_like(p)
            elif not g.is_contiguous():
                raise ValueError(f"commrt: .grad of parameter {name} is not contiguous; GradientSync "
                                 f"packs gradients in place and needs contiguous ones")
            out.append(g)
        return out

    def _pack(self, b: int, scale: float) -> None:
        views = self._views[b]
        if views is None:
            pack(self._grads(self.buckets[b], create=False), self._buffers[b], scale=scale)
            return
        # Gradients normally already sit in the buffer (autograd accumulated
        # into the views, and hands back the same tensor object: one identity
        # test per parameter); bring in any that were set to None or replaced.
        for p, v in zip(self.buckets[b].params, views):
            g = p.grad
            if g is v:
                continue
            if g is None:
                v.zero_()
            elif g.data_ptr() != v.data_ptr():
                v.copy_(g)
        if scale != 1.0:
            self._buffers[b].mul_(scale)

    def _unpack(self, b: int) -> None:
        views = self._views[b]
        if views is None:
            unpack(self._buffers[b], self._grads(self.buckets[b], create=True))
            return
        for p, v in zip(self.buckets[b].params, views):
            g = p.grad
            if g is not v and (g is None or g.data_ptr() != v.data_ptr()):
                p.grad = v

    def _span(self, name: str, b: int):
        return self.tracer.span(name, bucket=b) if self.tracer is not None else contextlib.nullcontext()

    def _run_bucket(self, step: int, b: int) -> None:
        if self.tracer is None and not self._cuda:
            return self._run_bucket_plain(step, b)
        buf, comm = self._buffers[b], self.comm
        t0 = time.perf_counter()
        with comm.transport.stream():
            if self._ready_events[b] is not None:
                torch.cuda.current_stream(comm.device).wait_event(self._ready_events[b])
            with self._span(f"commrt/bucket{b}/pack", b):
                self._pack(b, self.policy.scale(step))
            t1 = time.perf_counter()
            with self._span(f"commrt/bucket{b}/comm", b):
                sent = self.policy.communicate(step, b, buf)
            t2 = time.perf_counter()
            with self._span(f"commrt/bucket{b}/unpack", b):
                self._unpack(b)
            if self._cuda:
                self._done_event = torch.cuda.Event()
                self._done_event.record(torch.cuda.current_stream(comm.device))
        self._account(t0, t1, t2, time.perf_counter(), sent)

    def _run_bucket_plain(self, step: int, b: int) -> None:
        """:meth:`_run_bucket` without a device stream or trace spans to enter (CPU, no tracer)."""
        t0 = time.perf_counter()
        self._pack(b, self.policy.scale(step))
        t1 = time.perf_counter()
        sent = self.policy.communicate(step, b, self._buffers[b])
        t2 = time.perf_counter()
        self._unpack(b)
        self._account(t0, t1, t2, time.perf_counter(), sent)

    def _account(self, t0: float, t1: float, t2: float, t3: float, sent: int) -> None:
        cur = self._cur
        cur.pack_s += t1 - t0
        cur.comm_s += t2 - t1
        cur.unpack_s += t3 - t2
        cur.bytes_sent += sent

    # ------------------------------------------------------------------- API

    def wait(self) -> None:
        """Block until every bucket is reduced and unpacked into ``.grad``.

        Parameters that got no gradient this step are reduced as zeros (see
        ``unused``). Raises :class:`~commrt.CommTimeoutError` if the step
        does not finish in time, naming the rank, peer, algorithm, step and
        bucket of the wait that expired.
        """
        if self._accumulating:
            raise RuntimeError("commrt: wait() inside no_sync(): leave the no_sync block first")
        t_wait = time.perf_counter()
        wait_us = self.tracer.now_us() if self.tracer else 0.0
        nb = len(self.buckets)
        with self._cv:
            unused = []
            for bucket in self.buckets:
                if self._ready[bucket.index]:
                    continue
                for name, p in zip(bucket.names, bucket.params):
                    if id(p) not in self._seen:
                        unused.append(name)
                self._mark_ready(bucket.index)
            # each bucket's own waits (and the previous step's after-step work) are bounded
            # by comm.timeout per schedule step; this is the backstop
            deadline = time.monotonic() + self.comm.timeout * (nb + 2)
            while self._done < nb and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeoutError(rank=self.comm.rank, peer=None, what="gradient buckets",
                                           timeout_s=self.comm.timeout * (nb + 2),
                                           algorithm=self.algorithm.name, bucket=self._next)
                self._cv.wait(left)
            if self._error is not None:
                self._raise_error()
            if self._cuda and self._done_event is not None:
                torch.cuda.current_stream(self.comm.device).wait_event(self._done_event)
            end = time.perf_counter()
            cur = self._cur
            cur.exposed_s = end - t_wait
            if self._first_grad_t is not None:
                cur.backward_s = self._last_grad_t - self._first_grad_t
            cur.step_s = end - self._step_start
            cur.extra = self.policy.step_stats()
            self.stats.add(cur)
            # buffers that hold the gradients themselves (grad_views) are not extra memory
            self.stats.buffer_bytes = (sum(b.numel() * b.element_size()
                                           for b, v in zip(self._buffers, self._views) if v is None)
                                       + self.policy.extra_bytes
                                       + sum(s.numel() * s.element_size()
                                             for s in self.comm.executor._scratch.values()))
            if self.tracer is not None:
                now_us = self.tracer.now_us()
                self.tracer.add("commrt/compute", self._step_start_us, wait_us, step=cur.step)
                self.tracer.add("commrt/wait", wait_us, now_us, step=cur.step)
                if self._first_grad_t is not None:
                    off = (self._first_grad_t - t_wait) * 1e6
                    self.tracer.add("commrt/backward", wait_us + off,
                                    wait_us + (self._last_grad_t - t_wait) * 1e6, step=cur.step)
                self._step_start_us = now_us
            # reset for the next step
            self._missing = [len(b.params) for b in self.buckets]
            self._ready = [False] * nb
            self._ready_events = [None] * nb
            self._done = 0
            self._next = 0
            self._seen.clear()
            self._first_grad_t = None
            self._cur = StepStats(step=cur.step + 1, buckets=nb)
            self._step_start = end
            self.comm._active_sync = None
        if self.unused is Unused.ERROR:
            self._raise_if_unused(unused)

    def _raise_if_unused(self, unused: list[str]) -> None:
        """unused="error": raise on every rank if any rank skipped parameters.

        One exchange of p counts per step; the names follow only when some
        count is not zero, so every rank takes the same branch."""
        counts = [int(c[0]) for c in gather_rows(self.comm, [len(unused)], torch.int64)]
        if not any(counts):
            return
        names = [n for b in self.buckets for n in b.names]
        index = {n: i for i, n in enumerate(names)}
        mine = [0] * len(names)
        for n in unused:
            mine[index[n]] = 1
        rows = gather_rows(self.comm, mine, torch.int8)
        parts = []
        for r, row in enumerate(rows):
            skipped = sorted(names[i] for i, v in enumerate(row) if v)
            if skipped:
                parts.append(f"rank {r}: {', '.join(skipped[:10])}"
                             + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""))
        raise ValueError("commrt: parameters without a gradient this step (unused='error'; reduced as zeros "
                         "so that no rank hangs, and no optimizer step taken): " + "; ".join(parts))

    def step(self, optimizer: torch.optim.Optimizer, zero_grad: bool = True) -> int:
        """``wait()``, then ``optimizer.step()``, then ``optimizer.zero_grad()``

        (in place, ``set_to_none=False``, when gradients live in the bucket
        buffers; see ``grad_views``). Returns the number of updates applied
        (1, except for families that may apply none or several, such as
        a late worker catching up)."""
        self.wait()
        t0 = time.perf_counter()
        us0 = self.tracer.now_us() if self.tracer else 0.0
        applied = self.policy.apply(optimizer)
        self._updates += applied
        if self.broadcast_buffers:
            broadcast_state(self.model, self.comm, parameters=False)
        if zero_grad:
            # gradients that live in bucket buffers are zeroed in place, so they stay there
            optimizer.zero_grad(set_to_none=not any(v is not None for v in self._views))
        t1 = time.perf_counter()
        last = self.stats.last
        last.optimizer_s = t1 - t0
        last.step_s += t1 - t0
        self._step_start = t1
        if self.tracer is not None:
            now = self.tracer.now_us()
            self.tracer.add("commrt/optimizer", us0, now, step=last.step)
            self._step_start_us = now
        return applied

    @property
    def global_step(self) -> int:
        """The global step this rank's parameters and optimizer state hold: the updates
        ``step()`` applied, unless the family tracks it itself (a late worker that
        catches up jumps to the latest step)."""
        held = self.policy.global_step
        return self._updates if held is None else held

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after the block syncs them all.

        Example::

            with sync.no_sync():
                loss_fn(model(x1), y1).backward()
            loss_fn(model(x2), y2).backward()
            sync.step(optimizer)
        """
        if self._first_grad_t is not None:
            raise RuntimeError("commrt: no_sync() entered with gradients of this step already in flight; "
                               "call sync.wait() first")
        prev, self._accumulating = self._accumulating, True
        try:
            yield
        finally:
            self._accumulating = prev

    def save_trace(self, path: str) -> str:
        """Write this rank's Chrome-trace JSON (needs ``trace=True``)."""
        if self.tracer is None:
            raise RuntimeError("tracing is off: create GradientSync(..., trace=True)")
        return self.tracer.save(path)

    def _raise_error(self) -> None:
        # caller holds _cv
        err = self._error
        if isinstance(err, CommError):
            raise err
        raise CommError(f"commrt: gradient sync failed in bucket {self._next}: {err!r}") from err

    def _quiesce(self) -> None:
        """Block until the policy's after-step work is done (before another collective
        on the communicator, which would otherwise interleave with it)."""
        if not self._background:
            return
        deadline = time.monotonic() + self.comm.timeout
        with self._cv:
            while self._background and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeoutError(rank=self.comm.rank, peer=None, what="after-step work",
                                           timeout_s=self.comm.timeout, algorithm=self.algorithm.name)
                self._cv.wait(left)
            if self._error is not None:
                self._raise_error()

    def close(self) -> None:
        """Finish work in flight, stop the progress thread and remove the hooks. Idempotent."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout=self.comm.timeout)
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.comm._syncs.discard(self)
        self.policy.close()

    def __enter__(self) -> "GradientSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{b.numel * self._buffers[0].element_size() / MB:.2f}" for b in self.buckets[:6])
        more = ", ..." if len(self.buckets) > 6 else ""
        return (f"GradientSync({len(self.buckets)} buckets [{sizes}{more}] MB, algorithm={self.algorithm.name}, "
                f"comm_dtype={self.comm_dtype}, rank {self.comm.rank}/{self.comm.world_size})")
