"""One commrt communicator per device type, for one torch.distributed group.

* CPU: gloo over the group's store (a ``cpu/`` prefix of it), or MPI when
  mpiexec started the ranks and the group is the whole world (``Options(
  cpu_transport="gloo")`` keeps gloo). Made when the group is made.
* CUDA: NCCL whose unique id travels through the store (a ``cuda/``
  prefix), made on the first CUDA call (a collective: every rank of the
  group reaches it in the same order, on the group's call thread).
"""

from __future__ import annotations

import datetime
import os
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commrt.algorithms import resolve
from commrt.distributed.ops import DeviceContext
from commrt.runtime.communicator import (
    Backend,
    Communicator,
    abort_on_error_wanted,
    install_abort_hook,
)
from commrt.runtime.environment import LaunchInfo, detect_launch
from commrt.runtime.rendezvous import check_timeout

#: the environment variable that picks the all-reduce algorithm (Options() default)
ALGORITHM_ENV = "COMMRT_ALGORITHM"


@dataclass(frozen=True)
class Options:
    """``pg_options`` for ``dist.init_process_group("commrt", pg_options=...)``.

    ``algorithm``: the all-reduce algorithm's name (``auto``, ``ring``,
    ``torus2d``, ``halving_doubling``, ...) or instance; None reads
    ``COMMRT_ALGORITHM`` (default ``auto``). Reduce-scatter and all-gather run
    it where it has those schedules, else ring.
    ``cpu_transport``: ``"auto"`` (MPI under mpiexec for the world group,
    else gloo), ``"gloo"`` or ``"mpi"``. ``piece_bytes``: pipelining grain.
    ``debug``: check every call across ranks (default: ``COMMRT_DEBUG``).
    """

    algorithm: object = None
    cpu_transport: str = "auto"
    piece_bytes: int = 4 << 20
    debug: bool | None = None

    def resolved_algorithm(self):
        name = self.algorithm
        if name is None:
            name = os.environ.get(ALGORITHM_ENV, "").strip() or "auto"
        return resolve(name)


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
        self.timeout = check_timeout(secs, "the process group's timeout") if secs > 0 else 1800.0
        self.global_ranks = list(global_ranks or range(size))
        self.algorithm = self.options.resolved_algorithm()
        self.lock = threading.Lock()
        self.by_type: dict[str, DeviceContext] = {"cpu": self._cpu()}

    def get(self, device: torch.device) -> DeviceContext:
        kind = torch.device(device).type
        with self.lock:
            dc = self.by_type.get(kind)
            if dc is None:
                if kind != "cuda":
                    raise NotImplementedError(
                        f"commrt process group: no transport for {kind} tensors (cpu and cuda)"
                    )
                dc = self.by_type[kind] = self._cuda()
            return dc

    def _launch(self) -> LaunchInfo:
        whole = self.size == int(os.environ.get("WORLD_SIZE", self.size))
        local = os.environ.get("LOCAL_WORLD_SIZE") if whole else None
        local_rank = int(os.environ.get("LOCAL_RANK", 0)) if whole else 0
        return LaunchInfo(
            "torch.distributed", self.rank, self.size, local_rank, int(local) if local else None
        )

    def _wrap(self, transport, backend: Backend) -> DeviceContext:
        o = self.options
        debug = o.debug
        if debug is None:
            debug = os.environ.get("COMMRT_DEBUG", "").strip().lower() in (
                "1",
                "true",
                "yes",
                "on",
                "detail",
            )
        comm = Communicator(
            transport, backend, self._launch(), self.timeout, o.piece_bytes, debug=debug
        )
        if abort_on_error_wanted() and self.size > 1:
            install_abort_hook(comm)
        return DeviceContext(comm, self.algorithm)

    def _cpu(self) -> DeviceContext:
        want = self.options.cpu_transport
        # the world is MPI's whole world: compared with MPI's size, not WORLD_SIZE, which
        # init_process_group(init_method=..., rank=, world_size=) leaves unset (the DDP
        # benchmark ran over gloo that way)
        world = self.size == _mpi_world_size() and self.global_ranks == list(range(self.size))
        if want == "mpi" and not world:
            raise ValueError(
                "commrt process group: cpu_transport='mpi' needs the group to be mpiexec's "
                f"whole world (this one is ranks {self.global_ranks}); use 'gloo' or 'auto'"
            )
        if want == "mpi" or (want == "auto" and world):
            return self._wrap(_mpi_in_torch_order(self.rank), Backend.MPI)
        from commrt.transports.gloo import GlooTransport

        store = dist.PrefixStore("cpu/", self.store)
        return self._wrap(GlooTransport(store, self.rank, self.size, self.timeout), Backend.GLOO)

    def _cuda(self) -> DeviceContext:
        from commrt.transports.nccl_bootstrap import init_nccl

        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        transport = init_nccl(
            self.rank,
            self.size,
            local_rank,
            None,
            make_store=lambda: dist.PrefixStore("cuda/", self.store),
        )
        return self._wrap(transport, Backend.NCCL)

    def close(self) -> None:
        with self.lock:
            for dc in self.by_type.values():
                dc.comm.close()
            self.by_type.clear()
