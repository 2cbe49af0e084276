"""Communicators: who am I, who else is there, and which engine moves bytes.

Example::

    import commrt
    with commrt.init(backend="auto") as comm:      # mpiexec, torchrun, or alone
        print(comm.rank, comm.world_size, comm.backend, comm.device)
        comm.barrier()
"""

from __future__ import annotations

import threading
import warnings

import torch

from commrt import settings
from commrt.diagnosis.abort import abort_on_error_wanted, install_abort_hook, say
from commrt.diagnosis.departures import CLOSED, Departures, track
from commrt.diagnosis.failures import failed_in_call, verdict_at_timeout
from commrt.diagnosis.stall import stall_seconds, start_watch
from commrt.errors import CommError, CommTimeoutError, api_boundary, did_you_mean, named_keywords
from commrt.process.environment import (
    LaunchInfo,
    detect_launch,
    log_level,
    rejoining,
    warn_misspelt,
)
from commrt.process.rendezvous import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, check_timeout  # noqa: F401  (init names the limit)
from commrt.process.threads import fit_torch_threads, usable_cores
from commrt.runtime.choice import Backend, Situation, choose, why
from commrt.runtime.connect import make_transport
from commrt.runtime.open_syncs import OpenSyncs
from commrt.runtime.slots import CommSlots
from commrt.transports.base import Transport

SPIN_S = settings.Seconds(
    100e-6,
    "how long a blocking collective polls before yielding its core, where every local rank has a "
    "core",
    "every blocking collective (`Communicator.spin_s`)",
    settings.POLLING,
)


class Communicator:
    """A group of ranks and the transport between them. Use :func:`init`.

    Attributes: ``rank``, ``world_size``, ``backend`` (:class:`Backend`),
    ``device`` (where tensors must live), ``local_rank``/``local_size``
    (ranks on this node; ``local_size`` is None if the launcher does not
    say), ``timeout`` (seconds any wait may take before
    :class:`~commrt.CommTimeoutError`).

    One collective runs at a time per communicator (a lock enforces it in
    this process); every rank must issue collectives in the same order.
    ``debug``: check every collective's arguments across ranks first (see
    :mod:`commrt.collectives.core`).
    ``spin_s``: how long waits inside a blocking collective poll before
    yielding the core (:func:`~commrt.transports.base.poll_until`):
    :data:`SPIN_S` when the launcher says every rank on this node has a
    core of its own, else 0 (with more ranks than cores, the peer being
    waited for needs this very core). GradientSync's progress thread never
    spins: backward runs beside it. Set it to 0 to never spin.
    """

    def __init__(
        self,
        transport: Transport,
        backend: Backend,
        launch: LaunchInfo,
        timeout: float,
        piece_bytes: int,
        debug: bool = False,
        why: str = "",
    ):
        self.transport, self.backend = transport, backend
        #: why it runs on ``backend`` (:func:`~commrt.runtime.choice.why`), as stats say
        self.why = why
        self.rank, self.world_size = transport.rank, transport.world_size
        self.device = transport.device
        #: ``device.type``, read once: torch makes a new string on every read of it (a cost
        #: that shows in a small all-reduce), and every collective compares it
        self.device_type = self.device.type
        self.local_rank, self.local_size = launch.local_rank, launch.local_size
        self.launcher = launch.launcher
        self.timeout, self.piece_bytes, self._debug = float(timeout), int(piece_bytes), bool(debug)
        self.spin_s = _spin_s(launch.local_size)
        if self.world_size > 1:  # as torchrun would have (commrt.process.threads)
            fit_torch_threads(launch.local_size)
        self.lock, self._closed = threading.RLock(), False
        #: what other modules derive once per communicator (a probed network, auto's choices)
        self.slots = CommSlots()
        #: what this rank began, and which peers left (commrt.diagnosis.departures); waits consult it
        self.departures = Departures(transport)
        transport.attach_departures(self.departures)
        #: the GradientSyncs open on it, and the one whose step is on the wire
        self.syncs = OpenSyncs(self.departures)
        track(self)
        from commrt.schedule.executor import Executor  # executor imports kernels; keep init light

        self.executor = Executor()
        #: the stall watch (commrt.diagnosis.stall), started by init(); None when off
        self.stall = None

    @property
    def debug(self) -> bool:
        """Whether every collective's arguments are checked across ranks first
        (``COMMRT_DEBUG``). Checked calls are remembered only while it is off
        (:mod:`commrt.collectives.core`), so the collectives' path asks nothing of it;
        turning it on forgets what was agreed and settled, so every call from then on
        is checked."""
        return self._debug

    @debug.setter
    def debug(self, on: bool) -> None:
        self._debug = bool(on)
        if on:  # no memo of a checked or settled call: every call is checked afresh
            self.slots.agreed_calls.clear()
            self.executor.settled.clear()

    @api_boundary
    def barrier(self, timeout: float | None = None) -> None:
        """Block until every rank arrives; raise CommTimeoutError after ``timeout`` s."""
        self.check_open()
        self.syncs.quiesce()
        self.departures.begin_call()
        t = self.timeout if timeout is None else check_timeout(timeout)
        with self.lock:
            pos, done = self.executor.position, False
            pos.barrier()  # the stall watch sees a rank in a barrier
            try:
                done = self.transport.barrier(t)
            finally:  # out of it; where it failed, kept for the verdict
                pos.end(done)
            if not done:
                error = CommTimeoutError(rank=self.rank, peer=None, what="barrier", timeout_s=t)
                if timeout is None:
                    self.verdict_at_timeout(error)
                raise error

    def run_schedule(self, schedule, buf: torch.Tensor, *args, **kwargs) -> int:
        """Run ``schedule`` in place on ``buf`` under this communicator's lock
        (:meth:`run_held`, which takes the same arguments); return the bytes this rank
        sent. The one place where a schedule meets the executor (:mod:`commrt.collectives`)."""
        with self.lock:
            return self.run_held(schedule, buf, *args, **kwargs)

    def run_held(
        self,
        schedule,
        buf: torch.Tensor,
        timeout: float | None = None,
        reduce=None,
        tracer=None,
        owner: torch.Tensor | None = None,
        *,
        bucket: int | None = None,
        transport: Transport | None = None,
        spin: bool = True,
        call=None,
    ) -> int:
        """Run ``schedule`` in place on ``buf`` under this communicator's timeout (unless
        ``timeout``), piece size and spin, for a caller that holds :attr:`lock` already
        (:meth:`run_schedule` takes it; a collective that selects, runs and observes takes
        it once for all three); return the bytes this rank sent
        (:meth:`commrt.schedule.executor.Executor.run`). A ``buf`` that is not contiguous
        runs through a contiguous copy, written back.
        ``reduce(dst, src)``: what a received piece meets instead of the executor's sum
        (:mod:`commrt.collectives.reductions`); an average is its caller's scale, before.
        ``owner``: the tensor whose life bounds the cached binding to ``buf``; None (or a
        copy made here) binds for this run alone, so nothing outlives a transient buffer.
        ``transport``: one the caller made (its ranks numbered as the schedule numbers
        them). ``spin=False``: never hold a core while waiting (GradientSync's progress
        thread). ``call``: the caller's record of the call, kept for :meth:`repeat`."""
        work = buf if buf.is_contiguous() else buf.contiguous()
        try:
            sent = self.executor.run(
                schedule,
                work,
                self.transport if transport is None else transport,
                self.timeout if timeout is None else check_timeout(timeout),
                self.piece_bytes,
                reduce,
                bucket,
                tracer,
                owner if work is buf else None,
                self.spin_s if spin else 0.0,
                call,
            )
        except CommTimeoutError as e:  # a call's own timeout or group: its caller's to handle
            if transport is None and timeout is None:
                self.verdict_at_timeout(e)
            raise
        except CommError as e:
            if transport is None:
                self.failed_in_call(e)
            raise
        if work is not buf:
            buf.copy_(work)
        return sent

    def repeat(self, run, buf: torch.Tensor, timeout: float | None = None, tracer=None) -> int:
        """Run the last call again on ``buf``, the contiguous buffer it ran on (``run``: the
        executor's ``last``, where the caller found its call: :mod:`commrt.collectives.memo`),
        under the lock, timeout (unless ``timeout``) and spin. Returns the bytes sent."""
        self.lock.acquire()  # not ``with``: its __enter__/__exit__ double a lock's cost
        try:
            t = self.timeout if timeout is None else check_timeout(timeout)
            return self.executor.repeat(run, buf, t, tracer, self.spin_s)
        except CommTimeoutError as e:
            if timeout is None:
                self.verdict_at_timeout(e)
            raise
        except CommError as e:
            self.failed_in_call(e)
            raise
        finally:
            self.lock.release()

    def note_op(self, op: str | None) -> None:
        """Note the torch.distributed ``op`` the calls run for now (None: none), for the
        stall verdict (:meth:`commrt.schedule.position.Position.note_op`)."""
        self.executor.position.note_op(op)

    def verdict_at_timeout(self, error: CommTimeoutError) -> None:
        """Before ``error`` (a wait ran out of this communicator's timeout) is raised
        (:func:`commrt.diagnosis.failures.verdict_at_timeout`)."""
        verdict_at_timeout(self.stall, self.departures, error)

    def failed_in_call(self, error: CommError) -> None:
        """Before ``error`` is raised, where the engine broke under a call or a peer failed
        (:func:`commrt.diagnosis.failures.failed_in_call`)."""
        failed_in_call(self.stall, self.departures, error)

    def admit_collective(self) -> None:
        """Check that a collective may start now; every collective calls this first.

        Raises if the communicator is closed or a GradientSync step is on the
        wire; otherwise lets open syncs' after-step work finish, so every rank
        issues the collective after it, in the same order
        (:meth:`commrt.runtime.open_syncs.OpenSyncs.check_idle`).
        """
        if self._closed:  # check_open(), inline: this runs before every collective
            raise CommError(f"rank {self.rank}: communicator is closed")
        if self.syncs.refs:  # a step on the wire is an open sync's: none open, none on it
            self.syncs.check_idle()
        self.departures.begin_checked_call()

    def check_open(self) -> None:
        """Raise :class:`CommError` if the communicator was closed."""
        if self._closed:
            raise CommError(f"rank {self.rank}: communicator is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    @api_boundary
    def close(self) -> None:
        """Close open GradientSyncs (each waits at most ``timeout`` for its progress thread),
        tell the peers this rank left (:mod:`commrt.diagnosis.departures`), then release the transport.
        Idempotent; the communicator is unusable after."""
        if self._closed:
            return
        try:
            for sync in self.syncs.open():
                sync.close()
        finally:
            self._closed = True
            if self.stall is not None:
                self.stall.stop()
            self.departures.announce(CLOSED)
            self.departures.close()
            self.transport.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def transport_text(self) -> str:
        """The transport and why it was chosen: ``shm (auto: where every rank is on one
        host)``."""
        return f"{self.backend.value} ({self.why})" if self.why else self.backend.value

    def __repr__(self) -> str:
        return (
            f"Communicator(rank={self.rank}, world_size={self.world_size}, "
            f"backend={self.backend.value}, device={self.device})"
        )


def log_transport(comm: Communicator) -> None:
    """With ``COMMRT_LOG=info``, rank 0 says which transport the job runs on and why
    (``debug``: every rank), on stderr: a job launched with mpiexec that got shared
    memory says so at once."""
    level = log_level()
    if level == "debug" or (level == "info" and comm.rank == 0):
        say(f"commrt: rank {comm.rank} of {comm.world_size}: transport {comm.transport_text}")


def _spin_s(local_size: int | None) -> float:
    """:data:`SPIN_S` if ``local_size`` ranks fit on this process's cores, else 0 (also when
    unknown)."""
    return float(SPIN_S) if local_size is not None and local_size <= usable_cores() else 0.0


def _candidates(backend: "str | Backend", launch: LaunchInfo, device, world_size: int):
    """The transports to try, best first: ``backend`` alone, or auto's order
    (:func:`commrt.runtime.choice.choose`), with a warning where a CUDA machine lacks
    CuPy/NCCL (what to install)."""
    if isinstance(backend, Backend):
        return (backend,)
    name = str(backend).lower()
    if name != "auto":
        try:
            return (Backend(name),)
        except ValueError:
            names = ["auto", *(str(b) for b in Backend)]
            raise ValueError(
                f"unknown backend {backend!r}; choose {', '.join(names)}"
                + did_you_mean(name, names)
            ) from None
    kind = torch.device(device).type if device is not None else None
    if kind is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    launched = world_size == launch.world_size  # the launcher's world, not one of init's args
    local_size = launch.local_size if launched else None
    mpi_world = launched and launch.launcher == "mpiexec"
    # a replacement that rejoins a running job is in one whose ranks may die
    s = Situation.here(kind, launch.launcher, world_size, local_size, mpi_world, rejoining())
    if kind == "cuda" and s.nccl_missing is not None and not choose(s)[0].moves_cuda:
        warnings.warn(
            "commrt: backend='auto' falls back to the CPU transports:\n  "
            + s.nccl_missing.removeprefix("commrt: "),
            stacklevel=3,
        )
    return choose(s)


@named_keywords
def init(
    backend: "str | Backend" = "auto",
    *,
    rank: int | None = None,
    world_size: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    master_addr: str | None = None,
    master_port: int | None = None,
    device: "torch.device | str | None" = None,
    piece_bytes: int = 4 << 20,
    debug: bool | None = None,
    abort_on_error: bool | None = None,
    stall_s: float | None = None,
) -> Communicator:
    """Create a :class:`Communicator`: every rank of the job calls it.

    Rank and world size come from the launcher (mpiexec, torchrun, ``commrt train``);
    the arguments override them.

    Args:
        backend: ``"auto"``, ``"nccl"``, ``"cuda_ipc"``, ``"mpi"``, ``"gloo"`` or
            ``"shm"`` (or a :class:`Backend`). ``"auto"`` follows the one order of
            :mod:`commrt.runtime.choice` (auto: nccl for CUDA tensors where CuPy with NCCL
            is installed and no two ranks share a GPU, else cuda_ipc for CUDA tensors where
            CuPy is installed and every rank is on one host, else shm where every rank is
            on one host, else mpi under mpiexec, else gloo; only gloo where the job must
            outlive a dead rank). A CUDA machine without CuPy/NCCL falls back with a
            warning that says what to install; shared memory that the ranks turn out not
            to share falls back on every rank alike. ``"shm"``
            (:mod:`commrt.transports.shm`) and ``"cuda_ipc"`` (several ranks per GPU if
            need be, :mod:`commrt.transports.cuda_ipc`) are refused, with the reason,
            where the ranks cannot share memory.
        rank: this process's rank (default: the launcher's).
        world_size: the number of ranks (default: the launcher's).
        timeout: seconds that bound every wait, at most :data:`MAX_TIMEOUT_S` (about 3
            years; :mod:`commrt.process.rendezvous` says why).
        master_addr: the rendezvous host (default: the launcher's ``MASTER_ADDR``).
        master_port: the rendezvous port (default: the launcher's ``MASTER_PORT``).
        device: nccl only; the default, or ``"cuda"`` without an index, is
            ``cuda:<local_rank % device_count>``.
        piece_bytes: the pipelining granularity of large transfers (at least 1024).
        debug: check every collective's arguments across ranks first and name the
            mismatches (default: ``COMMRT_DEBUG``).
        abort_on_error: an exception that nobody catches ends the whole job with exit
            status 1 (``MPI_Abort`` under MPI) instead of leaving the other ranks
            waiting (default: True, or ``COMMRT_ABORT_ON_ERROR``); turn it off where
            the program handles rank failures itself.
        stall_s: seconds without progress inside a collective before the stall watch
            gives its verdict (:mod:`commrt.diagnosis.stall`); default ``COMMRT_STALL_S``,
            else half the timeout, between 60 s and 5 minutes; 0: off; not shorter
            than the timeout: the verdict forms at the timeout, in the error.

    Returns:
        This rank's communicator.

    Example::

        >>> comm = commrt.init(backend="gloo")   # doctest: +SKIP
    """
    timeout = check_timeout(timeout)
    if piece_bytes < 1024:
        raise ValueError(f"piece_bytes must be at least 1024, got {piece_bytes}")
    debug = settings.DEBUG.get() if debug is None else debug
    abort_on_error = abort_on_error_wanted() if abort_on_error is None else abort_on_error
    launch = detect_launch()
    rank = launch.rank if rank is None else int(rank)
    world_size = launch.world_size if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    order, address = _candidates(backend, launch, device, world_size), (master_addr, master_port)
    be, transport = make_transport(order, launch, rank, world_size, timeout, address, device)
    auto = not isinstance(backend, Backend) and str(backend).lower() == "auto"
    comm = Communicator(transport, be, launch, timeout, piece_bytes, bool(debug), why(be, auto))
    log_transport(comm)
    warn_misspelt(comm.rank)
    if abort_on_error is not False and world_size > 1:
        install_abort_hook(comm, "commrt.init(abort_on_error=False) or COMMRT_ABORT_ON_ERROR=0")
    comm.stall = start_watch(comm, stall_seconds(stall_s, timeout), abort_on_error is not False)
    return comm
