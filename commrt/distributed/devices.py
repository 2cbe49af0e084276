"""One commrt communicator per device type, for one torch.distributed group.

* CPU: auto's order (:mod:`commrt.runtime.choice`, as ``commrt.init``
  takes it): shared-memory rings (:mod:`commrt.transports.shm`) when every
  rank of the group is on this host and can map the others' memory; else
  MPI when mpiexec started the ranks and the group is the whole world; else
  gloo. Shared memory and gloo meet through the group's store (a ``cpu/``
  prefix of it). ``Options(cpu_transport=...)`` or ``COMMRT_CPU_TRANSPORT``
  picks one. Made when the group is made.
* CUDA: the first CUDA transport of the same order, NCCL, whose unique id
  travels through the store (a ``cuda/``
  prefix), on the device of the first CUDA call's tensor, with the group's
  timeout. It is made on the group's call thread, when that call runs (a
  collective: every rank of the group reaches it in the same order), so
  the caller's own current device is never changed and NCCL binds to the
  thread that drives it. The reduce kernel is warmed then
  (:func:`warm_kernels`): on CUDA its first launch per size class
  autotunes, which would otherwise happen in the first training step.
* CUDA point-to-point (``send``, ``recv``): a 2-rank NCCL communicator per
  pair of ranks, as ProcessGroupNCCL makes (:meth:`DeviceComms.pair`), made
  on the caller's thread by just the two peers (the group's communicator
  is collective: only two ranks reach a send and its receive), its unique
  id under a ``cuda/p2p/<low>:<high>/`` prefix. A group of 3 to
  ``Options.eager_pairs`` ranks makes every pair, and connects it, right
  after its CUDA communicator, all ranks in one fixed order (pairs sorted
  by their two ranks: the first unmade pair always has both its ranks at
  it, so none waits forever): a ring of sends to rank r + 1 before the
  receives from r − 1 (each rank's first send blocking until its pair
  exists and is connected) then finds every pair ready. A pair made at
  its first use waits for the peer's first use, and in such a ring every
  rank waits for the next. NCCL has no tags: it
  matches messages per peer in the order they were issued, so a send on
  the caller's thread on the group's communicator could land in the
  receive of a collective the call thread issues; on a communicator of
  its own it never can. The pairs and the group's communicator may run
  kernels at once on one device: NCCL's documentation asks, of several
  communicators used concurrently, that their operations be issued in the
  same order on every rank, which a program's own point-to-point order
  (a pipeline's schedule) and the group's collectives must then keep.
"""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commrt import settings
from commrt.algorithms import resolve
from commrt.algorithms.names import NAMES
from commrt.diagnosis.abort import abort_on_error_wanted, install_abort_hook
from commrt.diagnosis.stall import stall_seconds, start_watch
from commrt.distributed.observe import process_tracer
from commrt.distributed.ops import DeviceContext
from commrt.errors import did_you_mean, named_keywords
from commrt.kernels import SUPPORTED_DTYPES as KERNEL_DTYPES
from commrt.process.environment import LaunchInfo, detect_launch
from commrt.process.rendezvous import DEFAULT_TIMEOUT_S, check_timeout
from commrt.process.threads import one_core_each
from commrt.runtime.choice import (
    Backend,
    Meeting,
    Situation,
    choose,
    cuda_transport_wanted,
    gpu_shared,
)
from commrt.runtime.communicator import Communicator
from commrt.runtime.connect import first_made
from commrt.schedule import tags
from commrt.schedule.p2p import Exchange, Where

#: the CPU transports a group can ask for: auto, or any that moves CPU tensors
CPU_TRANSPORTS = ("auto", *(b.value for b in Backend if not b.moves_cuda))
#: families that are no all-reduce, so no torch.distributed collective can run them: why, and
#: where to get them instead
NOT_ALL_REDUCE = {
    "gossip": (
        "gossip mixes each gradient with one peer instead of summing over every rank; "
        "use it under DDP through the hook (commrt.distributed.hooks.gossip_hook) "
        "or with commrt.GradientSync(algorithm='gossip')"
    ),
    "backup": (
        "backup workers take the first N of N + b gradients, which needs commrt's "
        "own step; use commrt.GradientSync(algorithm='backup')"
    ),
}


@named_keywords
@dataclass(frozen=True)
class Options:
    """``pg_options`` for ``dist.init_process_group("commrt", pg_options=...)``.

    ``algorithm``: the all-reduce algorithm's name (``auto``, ``ring``,
    ``torus2d``, ``halving_doubling``, ...) or instance; None reads
    ``COMMRT_ALGORITHM`` (default ``auto``). Reduce-scatter and all-gather run
    it where it has those schedules, else ring.
    ``cpu_transport``: ``"auto"`` (shared memory where every rank is on one
    host, else MPI under mpiexec for the world group, else gloo), ``"shm"``,
    ``"gloo"`` or ``"mpi"``; ``COMMRT_CPU_TRANSPORT`` sets it for ``"auto"``.
    ``piece_bytes``: pipelining grain.
    ``debug``: check every call across ranks (default: ``COMMRT_DEBUG``).
    ``warm_dtypes``: the dtypes whose reduce kernel is warmed when the CUDA
    communicator is made (:func:`warm_kernels`); None: the dtype of the call
    that made it (float32 if the kernels do not handle that one); ``()``: none.
    ``eager_pairs``: a group of 3 to this many ranks makes and connects every
    point-to-point pair communicator with its CUDA communicator (module
    docs); a larger group makes each at its first send or receive (fewer
    communicators, and a ring of sends issued before their receives waits
    until the timeout there). 0: always at first use.
    """

    algorithm: object = None
    cpu_transport: str = "auto"
    piece_bytes: int = 4 << 20
    debug: bool | None = None
    warm_dtypes: tuple | None = None
    eager_pairs: int = 8

    def resolved_algorithm(self):
        """The group's all-reduce: ``algorithm``, else ``COMMRT_ALGORITHM``, else auto.

        Read when the group is made, so a name the backend cannot run is refused at
        init, naming where it came from: an unknown name (with the usable ones), or a
        family that is no all-reduce (:data:`NOT_ALL_REDUCE`: why, and where to get it),
        which would otherwise pass init and end the job at DDP's first all-reduce."""
        given, source = self.algorithm, "pg_options algorithm"
        if given is None:
            given = settings.ALGORITHM.get()
            source = settings.ALGORITHM.name
        try:
            alg = resolve(given)
        except ValueError:
            if not isinstance(given, str):
                raise
            usable = [n for n in NAMES if n not in NOT_ALL_REDUCE]
            raise ValueError(
                f"{source}={given!r} is no algorithm; choose one of {', '.join(usable)}"
                + did_you_mean(given, usable)
            ) from None
        if alg.family in NOT_ALL_REDUCE:
            why = NOT_ALL_REDUCE[alg.family]
            if isinstance(given, str):
                raise ValueError(
                    f"{source}={given} is refused by the torch.distributed backend: {why}"
                )
            raise ValueError(f"{source} {alg.family} is refused: {why}")
        return alg


def warm_kernels(comm: Communicator, dtypes) -> int:
    """Launch the reduce kernel once per size class it can meet on ``comm``, for each of
    ``dtypes``, on zeros of its own; return the number of launches.

    On CUDA the first launch of a size class (its bit length) and dtype autotunes:
    Triton benchmarks every config, synchronising the device and allocating a large
    flush buffer. The group's calls sum pieces of at most ``piece_bytes``, of any size
    below, so every class up to a piece's runs here, when the communicator is made
    (DDP's first call is its parameter broadcast, at construction), not on the call
    thread in the middle of the first backward. Nothing happens on the CPU, nor in a
    world of one (no call sums anything). AVG's pack scales whole tensors, of any size:
    it still tunes on a size's first use."""
    if comm.device.type != "cuda" or comm.world_size < 2:
        return 0
    launches = 0
    for dtype in dtypes:
        sizes = warm_sizes(comm.piece_bytes, dtype)
        dst = torch.zeros(sizes[-1], dtype=dtype, device=comm.device)
        src = torch.zeros_like(dst)
        for n in sizes:
            comm.executor.reduce(dst[:n], src[:n])
            launches += 1
    return launches


def warm_sizes(piece_bytes: int, dtype: torch.dtype) -> list[int]:
    """One element count per size class (bit length) a piece of at most ``piece_bytes`` of
    ``dtype`` can have: 1, 2, 4, ... up to the class of a whole piece."""
    most = max(1, piece_bytes // torch.empty(0, dtype=dtype).element_size())
    return [1 << (bits - 1) for bits in range(1, most.bit_length() + 1)]


def cuda_transport(
    backend: Backend, rank: int, size: int, local_rank: int, device, store, timeout: float
):
    """A CUDA transport of ``backend`` (its row's make) for ``rank`` of ``size``, meeting
    the others through ``store``; ``device`` None: ``cuda:<local_rank % GPUs>``."""
    meeting = Meeting(rank, size, timeout, lambda: store, _no_mpi, local_rank, device)
    return first_made((backend,), meeting, f"backend {backend}")[1]


def _no_mpi():
    raise ValueError("commrt process group: a CUDA transport meets through the group's store")


def _mpi_world_size() -> int | None:
    """The MPI world's size when mpiexec started this process, else None."""
    info = detect_launch()
    return info.world_size if info.launcher == "mpiexec" else None


def _mpi_in_torch_order(rank: int):
    """An MPI transport whose ranks are torch's: torch may number the processes otherwise
    than MPI did (``init_process_group(rank=...)``), so the world is split once, keyed by
    the torch rank (a collective: every rank makes the group's transport in step)."""
    from mpi4py import MPI

    from commrt.transports.mpi import MpiTransport

    ordered = MPI.COMM_WORLD.Split(0, rank)
    try:
        return MpiTransport(ordered)
    finally:
        ordered.Free()  # MpiTransport keeps its own duplicate


class DeviceComms:
    """The group's communicators by device type (module docs)."""

    def __init__(
        self,
        store,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        options,
        group_id: str,
        global_ranks,
    ):
        self.store, self.rank, self.size = store, rank, size
        self.group_id = group_id
        self.options = options if isinstance(options, Options) else Options()
        secs = timeout.total_seconds() if timeout is not None else 0
        self.timeout = (
            check_timeout(secs, "the process group's timeout") if secs > 0 else DEFAULT_TIMEOUT_S
        )
        self.global_ranks = list(global_ranks or range(size))
        self.algorithm = self.options.resolved_algorithm()
        #: the process's trace (COMMRT_TRACE), which every call of the group records into
        self.tracer = process_tracer(self.global_ranks[rank])
        #: whether this node's ranks have one core each or less (commrt.distributed.dispatch)
        self.one_core_each = one_core_each(self._launch().local_size)
        self.lock = threading.Lock()
        #: the CUDA device the group's NCCL runs on: the first CUDA call's (None before);
        #: chosen under a lock of its own, since ``lock`` is held while NCCL is made
        self.cuda_device: torch.device | None = None
        self.pick_lock = threading.Lock()
        #: point-to-point's communicators by peer (:meth:`pair`), each made under its lock
        self.pairs: dict[int, Communicator] = {}
        self.pair_locks: dict[int, threading.Lock] = {}
        self.by_type: dict[str, DeviceContext] = {"cpu": self._cpu()}

    def check(self, device: torch.device) -> torch.device | None:
        """On the caller's thread, before a call is queued: the CUDA device a call on
        ``device`` runs on (None on the CPU). NotImplementedError for other device types,
        ValueError for a CUDA device other than the group's (one NCCL communicator)."""
        device = torch.device(device)
        if device.type == "cpu":
            return None
        if device.type != "cuda":
            raise NotImplementedError(
                f"commrt process group: no transport for {device.type} tensors (cpu and cuda)"
            )
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        with self.pick_lock:
            if self.cuda_device is None:
                self.cuda_device = device
        if device != self.cuda_device:
            raise ValueError(
                f"commrt process group: a tensor on {device}, but this group's NCCL "
                f"communicator is on {self.cuda_device}, where its first CUDA call was"
            )
        return device

    def ready(self, device: torch.device) -> DeviceContext | None:
        """The context for ``device``'s type if it is made, else None."""
        return self.by_type.get(torch.device(device).type)

    def get(self, device: torch.device, dtype: torch.dtype | None = None) -> DeviceContext:
        """The context for ``device``'s type; a CUDA one is made on first use (on the
        group's call thread, module docs), its kernels warmed for ``dtype``."""
        kind = torch.device(device).type
        with self.lock:
            dc = self.by_type.get(kind)
            if dc is None:
                if kind != "cuda":
                    raise NotImplementedError(
                        f"commrt process group: no transport for {kind} tensors (cpu and cuda)"
                    )
                dc = self.by_type[kind] = self._cuda(dtype)
            return dc

    def pair(self, peer: int, device: torch.device) -> Communicator:
        """The 2-rank NCCL communicator that CUDA sends to and receives from ``peer`` run on
        (module docs): rank 0 of it is the lower of the two group ranks. Made on the
        caller's thread at the first send or receive between the two, collectively by
        just those two (it waits up to the group's timeout for the peer's), on ``device``
        (from :meth:`check`), the caller's current device left as it was. ValueError for a
        peer that is no other rank of the group."""
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(
                f"commrt process group: rank {self.rank} cannot send to or receive from "
                f"rank {peer} (the group has ranks 0 to {self.size - 1})"
            )
        with self.pick_lock:
            lock = self.pair_locks.setdefault(peer, threading.Lock())
        with lock:
            comm = self.pairs.get(peer)
            if comm is None:
                comm = self.pairs[peer] = self._pair(peer, device)
            return comm

    def _pair(self, peer: int, device: torch.device) -> Communicator:
        low, high = sorted((self.rank, peer))
        store = dist.PrefixStore(f"cuda/p2p/{low}:{high}/", self.store)
        backend = self.cuda_backend()
        with torch.cuda.device(device):  # the transport sets its device: not the caller's
            transport = cuda_transport(
                backend, int(self.rank == high), 2, 0, device, store, self.timeout
            )
        launch = LaunchInfo("torch.distributed", transport.rank, 2, 0, None)
        return Communicator(transport, backend, launch, self.timeout, self.options.piece_bytes)

    def _launch(self) -> LaunchInfo:
        info = detect_launch()  # the launcher's variables, read where init reads them
        whole = self.size == info.world_size
        local_rank, local = (info.local_rank, info.local_size) if whole else (0, None)
        return LaunchInfo("torch.distributed", self.rank, self.size, local_rank, local)

    def _wrap(self, transport, backend: Backend) -> DeviceContext:
        o = self.options
        debug = settings.DEBUG.get() if o.debug is None else o.debug
        comm = Communicator(
            transport, backend, self._launch(), self.timeout, o.piece_bytes, debug=debug
        )
        if abort_on_error_wanted() and self.size > 1:
            install_abort_hook(comm)
        if self.global_ranks == list(range(self.size)):  # the whole job's group: the stall watch
            comm.stall = start_watch(
                comm, stall_seconds(None, self.timeout), abort_on_error_wanted()
            )
        return DeviceContext(comm, self.algorithm, self.tracer)

    def _cpu(self) -> DeviceContext:
        want = self.options.cpu_transport
        if want == "auto":
            want = settings.CPU_TRANSPORT.get().lower()
        if want not in CPU_TRANSPORTS:
            raise ValueError(
                f"commrt process group: cpu transport {want!r} is none of "
                f"{', '.join(CPU_TRANSPORTS)} (pg_options cpu_transport or "
                f"{settings.CPU_TRANSPORT.name})"
            )
        # the world is MPI's whole world: compared with MPI's size, not WORLD_SIZE, which
        # init_process_group(init_method=..., rank=, world_size=) leaves unset (the DDP
        # benchmark ran over gloo that way)
        world = self.size == _mpi_world_size() and self.global_ranks == list(range(self.size))
        if want != "auto" and Backend(want).started_by_mpiexec and not world:
            raise ValueError(
                "commrt process group: cpu_transport='mpi' needs the group to be mpiexec's "
                f"whole world (this one is ranks {self.global_ranks}); use 'gloo' or 'auto'"
            )
        launch = self._launch()
        order = (  # auto: the one order (commrt.runtime.choice), shared memory first
            choose(Situation.here("cpu", launch.launcher, self.size, launch.local_size, world))
            if want == "auto"
            else (Backend(want),)
        )
        meeting = Meeting(
            self.rank,
            self.size,
            self.timeout,
            lambda: dist.PrefixStore("cpu/", self.store),
            lambda: _mpi_in_torch_order(self.rank),
        )
        backend, transport = first_made(order, meeting, "cpu_transport 'shm'")
        return self._wrap(transport, backend)

    def cuda_backend(self) -> Backend:
        """The CUDA transport of auto's order (:func:`commrt.runtime.choice.choose`):
        NCCL, or cuda_ipc where ranks of this host share a GPU (NCCL refuses them) or
        ``COMMRT_CUDA_TRANSPORT`` says so. NCCL's bootstrap says itself what it lacks."""
        launch = self._launch()
        s = Situation(
            "cuda",
            launch.launcher,
            self.size,
            launch.local_size,
            gpu_shared=gpu_shared(launch.local_size, self.size),
            cuda_transport=cuda_transport_wanted(),
        )
        return next(b for b in choose(s) if b.moves_cuda)

    def _cuda(self, dtype: torch.dtype | None) -> DeviceContext:
        """The CUDA communicator on :meth:`cuda_backend`."""
        backend = self.cuda_backend()
        local_rank = detect_launch().local_rank
        transport = cuda_transport(
            backend,
            self.rank,
            self.size,
            local_rank,
            self.cuda_device,  # None (made without check()): LOCAL_RANK's
            dist.PrefixStore("cuda/", self.store),
            self.timeout,
        )
        dc = self._wrap(transport, backend)
        warm = self.options.warm_dtypes
        if warm is None:
            warm = (dtype if dtype in KERNEL_DTYPES else torch.float32,)
        warm_kernels(dc.comm, warm)
        if 3 <= self.size <= self.options.eager_pairs:
            self._make_pairs(dc.comm.device)
        return dc

    def _make_pairs(self, device: torch.device) -> None:
        """Make and connect every pair communicator of this rank, in the order of the
        pairs sorted by their two ranks (module docs): a message each way on each."""
        for peer in range(self.size):
            if peer == self.rank:
                continue
            comm = self.pair(peer, device)
            mine, theirs = torch.zeros(1, device=device), torch.empty(1, device=device)
            low, high = sorted((self.rank, peer))
            where = Where(f"connecting pair communicator {low}:{high}")
            pair = [(mine, 1 - comm.rank)], [(theirs, 1 - comm.rank)]
            Exchange(comm, *pair, tags.torch_p2p(0), where).complete()

    def close(self) -> None:
        with self.lock:
            for dc in self.by_type.values():
                dc.comm.close()
            self.by_type.clear()
        with self.pick_lock:
            pairs, self.pairs = self.pairs, {}
        for peer in sorted(pairs):  # every rank in the pairs' order: a close waits for the peer's
            pairs[peer].close()
