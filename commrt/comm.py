"""Communicators: who am I, who else is there, and which engine moves bytes.

Example::

    import commrt
    with commrt.init(backend="auto") as comm:      # mpiexec, torchrun, or alone
        print(comm.rank, comm.world_size, comm.backend, comm.device)
        comm.barrier()
"""
from __future__ import annotations

import datetime
import enum
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Mapping

import torch

from commrt.errors import CommError, CommTimeoutError
from commrt.transports.base import Transport

DEFAULT_TIMEOUT_S = 300.0
_NODE_KEY = "commrt.ranks_per_node"
#: seconds an aborting rank waits for the launcher to forward its last output
ABORT_GRACE_S = 0.5
#: how long a blocking collective polls before yielding its core, when every local rank has one
SPIN_S = 100e-6


class Backend(enum.Enum):
    NCCL = "nccl"
    MPI = "mpi"
    GLOO = "gloo"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class LaunchInfo:
    """Rank layout as the launcher announced it in the environment."""

    launcher: str          # "mpiexec", "torchrun" or "none"
    rank: int
    world_size: int
    local_rank: int
    local_size: int | None   # None when the launcher does not say
    master_addr: str | None = None
    master_port: int | None = None


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"environment variable {n}={v!r} is not an integer") from None
    return None


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read rank and world size from MPICH/Hydra, Open MPI or torchrun variables.

    torchrun's variables win when both are present (torchrun under an MPI
    allocation); without any launcher the process is rank 0 of 1.
    """
    env = os.environ if env is None else env
    port = _int(env, "MASTER_PORT")
    addr = env.get("MASTER_ADDR") or None
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchInfo("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                          _int(env, "LOCAL_RANK") or 0, _int(env, "LOCAL_WORLD_SIZE"), addr, port)
    rank = _int(env, "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
    size = _int(env, "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
    if rank is not None and size is not None:
        local_rank = _int(env, "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK") or 0
        local_size = _int(env, "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
        return LaunchInfo("mpiexec", rank, size, local_rank, local_size, addr, port)
    return LaunchInfo("none", 0, 1, 0, 1, addr, port)


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
    :mod:`commrt.collectives`).
    ``spin_s``: how long waits inside a blocking collective poll before
    yielding the core (:func:`~commrt.transports.base.poll_until`):
    :data:`SPIN_S` when the launcher says every rank on this node has a
    core of its own, else 0 (with more ranks than cores, the peer being
    waited for needs this very core). GradientSync's progress thread never
    spins: backward runs beside it. Set it to 0 to never spin.
    """

    def __init__(self, transport: Transport, backend: Backend, launch: LaunchInfo,
                 timeout: float, piece_bytes: int, debug: bool = False):
        self.transport = transport
        self.backend = backend
        self.rank = transport.rank
        self.world_size = transport.world_size
        self.device = transport.device
        self.local_rank = launch.local_rank
        self.local_size = launch.local_size
        self.launcher = launch.launcher
        self.timeout = float(timeout)
        self.piece_bytes = int(piece_bytes)
        self.debug = bool(debug)
        self.spin_s = _spin_s(launch.local_size)
        self.lock = threading.RLock()
        #: per-communicator derived data (e.g. a probed network model), keyed by owner
        self.cache: dict = {}
        #: the GradientSync whose step is in flight (its buckets own the message sequence)
        self._active_sync = None
        #: open GradientSyncs, whose after-step work must finish before another collective
        self._syncs: weakref.WeakSet = weakref.WeakSet()
        self._closed = False
        from commrt.executor import Executor   # executor imports kernels; keep init light
        self.executor = Executor()

    def ranks_per_node(self) -> int | None:
        """Ranks per node as every rank agrees: collective on the first call, then cached.

        L when each rank's launcher says L ranks share its node and they sit
        in blocks (local rank = rank mod L) with 1 < L < world size; None,
        on every rank alike, otherwise (one node, one rank per node, uneven
        nodes, no launcher information). ``Torus2D()``'s default grid and
        the probe's two link classes follow it, so a launch whose ranks
        disagree about their nodes gets the same schedule everywhere, not a
        hang.

        Example::

            >>> comm.ranks_per_node()   # torchrun --nnodes 4 --nproc-per-node 8  # doctest: +SKIP
            8
        """
        if _NODE_KEY not in self.cache:
            p, agreed = self.world_size, None
            if p > 1:
                from commrt.collectives import gather_rows
                rows = gather_rows(self, [self.local_size or 0, self.local_rank])
                L = int(rows[0][0])
                blocks = all((int(a), int(b)) == (L, r % max(L, 1))
                             for r, (a, b) in enumerate(rows))
                agreed = L if 1 < L < p and p % L == 0 and blocks else None
            self.cache[_NODE_KEY] = agreed
        return self.cache[_NODE_KEY]

    def barrier(self, timeout: float | None = None) -> None:
        """Block until every rank arrives; raise CommTimeoutError after ``timeout`` s."""
        self._check_open()
        self._settle()
        t = self.timeout if timeout is None else timeout
        with self.lock:
            if not self.transport.barrier(t):
                raise CommTimeoutError(rank=self.rank, peer=None, what="barrier", timeout_s=t)

    def _settle(self) -> None:
        """Let GradientSync work that outlives wait() (asynchronous families) finish
        first, so that every rank issues this collective after it, in the same order."""
        for sync in tuple(self._syncs):
            sync._quiesce()

    def _check_open(self) -> None:
        if self._closed:
            raise CommError(f"rank {self.rank}: communicator is closed")

    def close(self) -> None:
        """Release the transport. Idempotent; the communicator is unusable after."""
        if not self._closed:
            self._closed = True
            self.transport.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, world_size={self.world_size}, "
                f"backend={self.backend.value}, device={self.device})")


def _spin_s(local_size: int | None) -> float:
    """:data:`SPIN_S` if ``local_size`` ranks fit on this process's cores, else 0 (also when
    unknown)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        cores = os.cpu_count() or 1
    return SPIN_S if local_size is not None and local_size <= cores else 0.0


def _resolve_backend(backend: "str | Backend", launch: LaunchInfo) -> Backend:
    if isinstance(backend, Backend):
        return backend
    name = str(backend).lower()
    if name == "auto":
        if torch.cuda.is_available():
            return Backend.NCCL
        return Backend.MPI if launch.launcher == "mpiexec" else Backend.GLOO
    try:
        return Backend(name)
    except ValueError:
        raise ValueError(f"unknown backend {backend!r}; choose auto, nccl, mpi or gloo") from None


def _mpi_world():
    from commrt.transports.mpi import _mpi
    return _mpi().COMM_WORLD


def _tcp_store(launch: LaunchInfo, rank: int, world_size: int, master_addr: str | None,
               master_port: int | None, timeout: float):
    """A TCPStore for gloo/NCCL rendezvous, wrapped in a commrt prefix.

    Port 0 under mpiexec: rank 0 lets the OS pick a free port and tells the
    others over MPI, so ``mpiexec -n 4 ... backend="gloo"`` needs no set-up.
    """
    import torch.distributed as dist
    td = datetime.timedelta(seconds=timeout)
    addr = master_addr or launch.master_addr or "127.0.0.1"
    port = master_port if master_port is not None else launch.master_port
    if world_size == 1:
        store = dist.HashStore()
    elif port is None and launch.launcher == "mpiexec":
        world = _mpi_world()
        store = (dist.TCPStore(addr, 0, world_size, True, timeout=td, wait_for_workers=False)
                 if rank == 0 else None)
        port = world.bcast(store.port if rank == 0 else None, root=0)
        addr = world.bcast(addr, root=0)
        if rank != 0:
            store = dist.TCPStore(addr, port, world_size, False, timeout=td)
    elif port is None:
        raise ValueError("gloo/nccl rendezvous needs MASTER_ADDR and MASTER_PORT (torchrun sets "
                         "them) or master_addr=/master_port= arguments")
    else:
        # Under torchrun's elastic agent the agent already hosts the store.
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        store = dist.TCPStore(addr, port, world_size, rank == 0 and not agent, timeout=td)
    return dist.PrefixStore("commrt", store)


def _env_flag(name: str) -> bool | None:
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return None
    if v in ("1", "true", "yes", "on", "detail"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name}={v!r}: use 1 or 0")


class _AbortOnError:
    """A ``sys.excepthook`` that ends the whole job when an exception escapes.

    Without it, a rank that dies of an uncaught error (a CommTimeoutError
    because a peer stopped, say) leaves the job hanging: MPI's shutdown
    waits for the stopped peer forever, and gloo peers wait for messages
    that never come until their own timeout. After the usual traceback,
    under MPI this calls ``MPI_Abort`` (as ``python -m mpi4py`` does),
    which makes the launcher kill every rank; otherwise the process exits
    at once with status 1, without running exit handlers that could block
    on the dead job. Installed once per process by :func:`init` and active
    while a multi-rank communicator that asked for it is open.
    """

    def __init__(self, previous):
        self.previous = previous
        self.comms: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def install(cls, comm: "Communicator") -> None:
        hook = sys.excepthook
        if not isinstance(hook, cls):
            hook = sys.excepthook = cls(hook)
        hook.comms.add(comm)

    def __call__(self, kind, value, tb) -> None:
        self.previous(kind, value, tb)
        live = [c for c in self.comms if not c._closed]
        if not live:
            return
        comm = live[0]
        # the message is repeated in this one line: a launcher that kills the job may drop
        # the tail of a long traceback, and this line is what names the failing peer
        print(f"commrt: rank {comm.rank}: uncaught {kind.__name__}: {value}; ending the whole job "
              f"(commrt.init(abort_on_error=False) or COMMRT_ABORT_ON_ERROR=0 to keep it running)",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            # MPI_Abort makes mpiexec kill every rank at once, and hydra drops whatever output
            # its proxy has not forwarded yet (seen on a loaded machine: the traceback cut in
            # half): give the forwarder a moment first
            time.sleep(ABORT_GRACE_S)
            mpi.COMM_WORLD.Abort(1)
        os._exit(1)


def init(backend: "str | Backend" = "auto", *, rank: int | None = None, world_size: int | None = None,
         timeout: float = DEFAULT_TIMEOUT_S, master_addr: str | None = None,
         master_port: int | None = None, device: "torch.device | str | None" = None,
         piece_bytes: int = 4 << 20, debug: bool | None = None, abort_on_error: bool | None = None,
         nccl_module=None) -> Communicator:
    """Create a :class:`Communicator`.

    ``backend``: ``"auto"`` (nccl where CUDA is available, mpi under
    mpiexec, gloo otherwise), ``"nccl"``, ``"mpi"`` or ``"gloo"``. Rank and
    world size come from the launcher (mpiexec or torchrun); explicit
    arguments override them. ``timeout`` bounds every wait (seconds).
    ``piece_bytes`` is the pipelining granularity of large transfers.
    ``debug`` (default: the ``COMMRT_DEBUG`` environment variable) checks
    every collective's arguments across ranks first and names mismatches.
    ``abort_on_error`` (default True, or ``COMMRT_ABORT_ON_ERROR``): an
    exception that nobody catches ends the whole job with exit status 1
    (``MPI_Abort`` under MPI) instead of leaving the other ranks waiting;
    turn it off if your program handles rank failures itself.
    ``nccl_module`` replaces ``cupy.cuda.nccl`` (for tests).

    Example::

        >>> comm = commrt.init(backend="gloo")   # doctest: +SKIP
    """
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if piece_bytes < 1024:
        raise ValueError(f"piece_bytes must be at least 1024, got {piece_bytes}")
    debug = _env_flag("COMMRT_DEBUG") if debug is None else debug
    abort_on_error = _env_flag("COMMRT_ABORT_ON_ERROR") if abort_on_error is None else abort_on_error
    launch = detect_launch()
    rank = launch.rank if rank is None else int(rank)
    world_size = launch.world_size if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    be = _resolve_backend(backend, launch)

    if be is Backend.MPI:
        from commrt.transports.mpi import MpiTransport
        world = _mpi_world()
        if world.Get_size() != world_size or world.Get_rank() != rank:
            raise ValueError(f"the mpi backend takes rank and size from MPI (rank {world.Get_rank()} "
                             f"of {world.Get_size()}), not rank {rank} of {world_size}; launch with "
                             f"mpiexec -n {world_size}")
        transport: Transport = MpiTransport(world)
    elif be is Backend.GLOO:
        from commrt.transports.gloo import GlooTransport
        store = _tcp_store(launch, rank, world_size, master_addr, master_port, timeout)
        transport = GlooTransport(store, rank, world_size, timeout)
    else:
        transport = _init_nccl(launch, rank, world_size, master_addr, master_port, timeout,
                               device, nccl_module)
    comm = Communicator(transport, be, launch, timeout, piece_bytes, debug=bool(debug))
    if abort_on_error is not False and world_size > 1:
        _AbortOnError.install(comm)
    return comm


def _init_nccl(launch, rank, world_size, master_addr, master_port, timeout, device, nccl_module):
    from commrt.transports.nccl import NcclTransport, import_nccl
    nccl = nccl_module if nccl_module is not None else import_nccl()
    if device is None:
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'nccl' needs a CUDA GPU and none is available here; "
                               "use backend='mpi' (under mpiexec) or backend='gloo'")
        device = torch.device("cuda", launch.local_rank % torch.cuda.device_count())
    device = torch.device(device)
    # Rank 0 makes the id; the others learn it over MPI or the TCPStore. cupy >= 14 takes
    # (and returns) the 128-byte ncclUniqueId as bytes; older cupys used a tuple of chars.
    uid = _uid_bytes(nccl.get_unique_id()) if rank == 0 else None
    if launch.launcher == "mpiexec" and master_port is None and launch.master_port is None:
        uid = _mpi_world().bcast(uid, root=0)
    else:
        store = _tcp_store(launch, rank, world_size, master_addr, master_port, timeout)
        if rank == 0:
            store.set("nccl_unique_id", uid)
        uid = bytes(store.get("nccl_unique_id"))
    return NcclTransport(rank, world_size, uid, device, nccl=nccl)


def _uid_bytes(uid) -> bytes:
    """The ncclUniqueId as the 128 bytes cupy >= 14 expects (older cupys give signed chars)."""
    return bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes((int(x) + 256) % 256 for x in uid)
