"""Which transport a communicator runs on: the one choice behind ``backend="auto"``.

:func:`choose` orders the transports that fit one launch and one device type,
best first; the caller makes the first it can. Shared memory is the one that
may still fail once tried (the ranks turn out to be on several hosts, or
/dev/shm has no room): :func:`commrt.transports.shm_connect.connect` then
says so on every rank alike, and every rank takes the next. Three callers ask,
so that they agree:

* :func:`commrt.runtime.communicator.init` (``backend="auto"``);
* the torch.distributed backend, one communicator per device type
  (:mod:`commrt.distributed.devices`, ``cpu_transport="auto"``);
* the command line, for the ranks it starts on this host (``commrt train``,
  ``bench allreduce``, ``probe`` with ``--backend auto``).

Every text that says what ``auto`` picks (the command line's ``--help``, the
README, the docs) is :func:`describe`, or is checked against it by a test.

Adding a transport: its module in :mod:`commrt.transports`, its traits in
:mod:`commrt.transports.traits`, a :class:`Backend` member, and its
:class:`Row` in :data:`ORDER`, where it ranks: what it is, where auto takes it
(in words and in code) and how it is made. Every caller reads that table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from commrt import settings
from commrt.transports import traits as engine
from commrt.transports.traits import Traits


class Backend(enum.Enum):
    """The transports a communicator can run on (``commrt.init(backend=...)``)."""

    NCCL = "nccl"
    CUDA_IPC = "cuda_ipc"
    MPI = "mpi"
    GLOO = "gloo"
    SHM = "shm"

    def __str__(self) -> str:
        return self.value

    # What a backend is: its row's (ORDER), read by every caller, so that none compares a
    # backend's name. A new backend is one row there.

    @property
    def row(self) -> "Row":
        """Its row of :data:`ORDER`: what it is, where auto takes it, how it is made."""
        return _ROWS[self]

    @property
    def traits(self) -> Traits:
        """What its transport is (:class:`~commrt.transports.traits.Traits`)."""
        return _ROWS[self].traits

    @property
    def moves_cuda(self) -> bool:
        """It moves CUDA tensors (and needs a GPU); the others move CPU tensors."""
        return self.traits.moves_cuda

    @property
    def started_by_mpiexec(self) -> bool:
        """Its ranks are mpiexec's processes: the command line starts them with mpiexec,
        and a group on it must be mpiexec's whole world. The one fact of its transport's
        ``meets_through_mpi``: ranks that meet through MPI's world must be its processes."""
        return self.traits.meets_through_mpi

    @property
    def one_death_ends_all(self) -> bool:
        """A rank's death ends every rank (the mpich wheel's MPI does), so nothing that
        must go on past a dead rank runs on it, and no rank waits on a dead one to close."""
        return self.traits.one_death_ends_all

    @property
    def takes_a_replacement(self) -> bool:
        """A replacement process may rejoin a running job under a dead rank's ``RANK``
        (``COMMRT_REJOIN=1``, ``commrt train --max-restarts``). The one fact of its
        transport's ``survives_peer_death``: a replacement is only of use where the
        survivors' reductions go on past the dead rank, and they do only there."""
        return self.traits.survives_peer_death


#: the launcher name of the command line's own ranks (``commrt train --nproc N``): all on
#: this host, started by the command line itself (by mpiexec when it picks mpi)
LOCAL = "commrt"


def cuda_transport_wanted(env=None) -> str:
    """``COMMRT_CUDA_TRANSPORT`` (default "auto"): "nccl" or "cuda_ipc" leaves auto only
    that one for CUDA tensors, wherever it runs (NCCL then says itself that it refuses
    ranks sharing a GPU); anything else is a ValueError that names the variable."""

    text = settings.CUDA_TRANSPORT.get(env).lower()
    if text not in CUDA_TRANSPORTS:
        raise ValueError(
            f"{settings.CUDA_TRANSPORT.name}={text!r} is none of {', '.join(CUDA_TRANSPORTS)}"
        )
    return text


def gpu_shared(ranks_here: int | None, world_size: int) -> bool:
    """Whether some ranks of this host share a GPU (each takes ``cuda:<local_rank % GPUs>``):
    more ranks here (``ranks_here``, else all of ``world_size``) than GPUs. NCCL refuses them."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus > 0 and (ranks_here or world_size) > gpus


#: why only gloo is taken where a rank may die and the job go on
ONLY_GLOO_SURVIVES = (
    "only gloo carries on past a dead rank (MPI ends every rank when one dies, "
    "and neither NCCL nor shared memory can take a replacement in)"
)


@dataclass(frozen=True)
class Situation:
    """What auto's choice depends on, for one communicator.

    ``device``: the type of the tensors it moves (``"cpu"`` or ``"cuda"``).
    ``launcher``: who started the ranks (:attr:`LaunchInfo.launcher
    <commrt.process.environment.LaunchInfo>`: ``"mpiexec"``, ``"torchrun"``,
    ``"none"``; ``"torch.distributed"`` for a process group; :data:`LOCAL`).
    ``world_size`` and ``local_size``: the ranks, and those on this host as
    the launcher says (None: it does not say, so they may all be here).
    ``mpi_world``: the ranks are mpiexec's whole world (for :data:`LOCAL`:
    mpi4py and mpiexec are installed, so the command line can start them so).
    ``ranks_may_die``: the job carries on past a dead rank (backup workers,
    ``--kill``, ``--max-restarts``): :data:`ONLY_GLOO_SURVIVES`.
    ``nccl_missing``: what this process lacks for NCCL (CuPy with libnccl:
    :func:`commrt.transports.nccl.import_nccl`'s error; None: nothing).
    ``cuda_ipc_missing``: what it lacks for CUDA IPC (CuPy's CUDA runtime:
    :func:`commrt.transports.cuda_ipc_device.import_runtime`'s error), which needs no NCCL.
    ``gpu_shared``: some ranks of this host share a GPU (:func:`gpu_shared`), which NCCL
    refuses. ``cuda_transport``: :func:`cuda_transport_wanted`.
    ``shm_unusable``: why this process cannot map shared memory
    (:func:`commrt.transports.shm_connect.unusable`), for a process that chooses
    for ranks it starts itself (the command line). Ranks that choose each for
    itself leave it None: what one rank lacks, the others would not see, so
    :func:`~commrt.transports.shm_connect.connect` finds it, for all together.
    """

    device: str = "cpu"
    launcher: str = "none"
    world_size: int = 1
    local_size: int | None = None
    mpi_world: bool = False
    ranks_may_die: bool = False
    nccl_missing: str | None = None
    shm_unusable: str | None = None
    gpu_shared: bool = False
    cuda_transport: str = "auto"
    cuda_ipc_missing: str | None = None

    @classmethod
    def here(
        cls,
        device: str,
        launcher: str,
        world_size: int,
        local_size: int | None,
        mpi_world: bool,
        ranks_may_die: bool = False,
    ) -> "Situation":
        """The situation with this process's checks for NCCL and CUDA IPC filled in (only
        for CUDA: importing CuPy takes a while)."""
        missing = ipc_missing = None
        shared, wanted = False, "auto"
        if device == "cuda":
            from commrt.transports.cuda_ipc_device import import_runtime
            from commrt.transports.nccl import import_nccl

            missing, ipc_missing = unavailable(import_nccl), unavailable(import_runtime)
            shared, wanted = gpu_shared(local_size, world_size), cuda_transport_wanted()
        return cls(
            device,
            launcher,
            world_size,
            local_size,
            mpi_world,
            ranks_may_die,
            missing,
            None,
            shared,
            wanted,
            ipc_missing,
        )

    @property
    def one_host(self) -> bool:
        """Whether every rank may be on this host (the launcher does not say otherwise)."""
        return self.local_size is None or self.local_size >= self.world_size


def unavailable(load) -> str | None:
    """None if ``load()`` (an engine's import) works here, else its error's text: what is
    missing and what to install."""
    try:
        load()
    except RuntimeError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class Meeting:
    """What a backend's transport is made from, the same for every row (:attr:`Row.make`).

    ``store()``: the store the ranks meet through (asked for only by the rows that meet
    there; :func:`~commrt.runtime.connect.first_made` makes it once); ``mpi()``: MPI's
    transport over these ranks, in their order; ``local_rank`` and ``device``: the CUDA
    device (None: ``cuda:<local_rank % GPUs>``); ``nccl_id_over_mpi``: NCCL's unique id
    travels over MPI's world (mpiexec started the ranks and no port was given) rather than
    through the store; ``rejoining``: this process replaces a dead rank of a running job
    (``COMMRT_REJOIN=1``), made only by a row whose backend
    :attr:`~Backend.takes_a_replacement`."""

    rank: int
    world_size: int
    timeout: float
    store: Callable[[], object]
    mpi: Callable[[], object]
    local_rank: int = 0
    device: object = None
    nccl_id_over_mpi: bool = False
    rejoining: bool = False


@dataclass(frozen=True)
class Row:
    """One backend, as NCCL's ``ncclTransports[]`` holds one transport: what it is
    (``traits``), where auto takes it (``where``, in words, and ``refuses``, in code: why
    not here, or None; :func:`fits`), how its transport is made (``make``: the
    transport, or why these ranks cannot use it after all, in words, every rank alike:
    auto then takes the next), and what its engine's own all-reduce is called
    (``native``: the bench's anchor where it is gloo's or MPI's)."""

    backend: Backend
    traits: Traits
    where: str
    refuses: Callable[[Situation], str | None]
    make: Callable[[Meeting], object]
    native: str


def _cuda_refuses(s: Situation, missing: str | None, backend: Backend) -> str | None:
    if s.device != "cuda":
        return "it moves CUDA tensors"
    if missing is not None:
        return missing
    if s.cuda_transport not in ("auto", backend.value):  # COMMRT_CUDA_TRANSPORT names one
        return f"{settings.CUDA_TRANSPORT.name} asks for {s.cuda_transport}"
    return None


def _nccl_refuses(s: Situation) -> str | None:
    why = _cuda_refuses(s, s.nccl_missing, Backend.NCCL)
    if why is None and s.cuda_transport == "auto" and s.gpu_shared:
        why = "ranks of this host share a GPU, which NCCL refuses"
    return why


def _cuda_ipc_refuses(s: Situation) -> str | None:
    why = _cuda_refuses(s, s.cuda_ipc_missing, Backend.CUDA_IPC)
    if why is None and s.cuda_transport == "auto" and not (s.world_size > 1 and s.one_host):
        why = "it joins ranks of one host, more than one"
    return why


def _shm_refuses(s: Situation) -> str | None:
    if not (s.world_size > 1 and s.one_host):
        return "it joins ranks of one host, more than one"
    return s.shm_unusable


def _mpi_refuses(s: Situation) -> str | None:
    return None if s.mpi_world else "the ranks are not mpiexec's whole world"


def _make_nccl(m: Meeting):
    from commrt.process.rendezvous import mpi_world
    from commrt.transports.nccl_bootstrap import init_nccl
    from commrt.transports.stand_ins import stand_in

    return init_nccl(
        m.rank,
        m.world_size,
        m.local_rank,
        m.device,
        stand_in("nccl"),
        mpi_world=mpi_world() if m.nccl_id_over_mpi else None,
        make_store=m.store,
        timeout=m.timeout,
    )


def _make_cuda_ipc(m: Meeting):
    from commrt.transports.cuda_ipc_connect import init_cuda_ipc
    from commrt.transports.stand_ins import stand_in

    return init_cuda_ipc(
        m.store(), m.rank, m.world_size, m.device, m.local_rank, m.timeout, stand_in("cuda_ipc")
    )


def _make_shm(m: Meeting):
    from commrt.transports.shm_connect import connect

    made = connect(m.store(), m.rank, m.world_size, m.timeout)
    return f"the ranks cannot share memory ({made})" if isinstance(made, str) else made


def _make_gloo(m: Meeting):
    from commrt.transports.gloo import GlooRejoined, GlooTransport

    if m.rejoining:  # the job's group does not reach a replacement: groups made after it do
        return GlooRejoined(m.rank, m.world_size)
    return GlooTransport(m.store(), m.rank, m.world_size, m.timeout)


#: every backend, in auto's order, best first (the last, gloo, fits everywhere)
ORDER: tuple[Row, ...] = (
    Row(
        Backend.NCCL,
        engine.NCCL,
        "for CUDA tensors where CuPy with NCCL is installed and no two ranks share a GPU",
        _nccl_refuses,
        _make_nccl,
        "ncclAllReduce",
    ),
    Row(
        Backend.CUDA_IPC,
        engine.CUDA_IPC,
        "for CUDA tensors where CuPy is installed and every rank is on one host",
        _cuda_ipc_refuses,
        _make_cuda_ipc,
        "cuda_ipc ordered sum",
    ),
    # shm's and cuda_ipc's: their ranks' values summed in rank order (the tests' oracle)
    Row(
        Backend.SHM,
        engine.SHM,
        "where every rank is on one host",
        _shm_refuses,
        _make_shm,
        "shm ordered sum",
    ),
    Row(Backend.MPI, engine.MPI, "under mpiexec", _mpi_refuses, lambda m: m.mpi(), "MPI_Allreduce"),
    Row(Backend.GLOO, engine.GLOO, "", lambda s: None, _make_gloo, "gloo allreduce"),
)
_ROWS = {row.backend: row for row in ORDER}  # the table's index: Backend.row

#: what ``COMMRT_CUDA_TRANSPORT`` may say: auto, or one transport that moves CUDA tensors
CUDA_TRANSPORTS = ("auto", *(b.value for b in Backend if b.moves_cuda))


def refusal(backend: Backend, s: Situation) -> str | None:
    """Why auto may not take ``backend`` in ``s``, in words; None where it may
    (:data:`ORDER` says where in words, its rows' ``refuses`` in code)."""
    row = backend.row
    if s.ranks_may_die and not row.traits.survives_peer_death:
        return ONLY_GLOO_SURVIVES
    return row.refuses(s)


def fits(backend: Backend, s: Situation) -> bool:
    """Whether auto may take ``backend`` in ``s`` (:func:`refusal` says why not)."""
    return refusal(backend, s) is None


def choose(s: Situation) -> tuple[Backend, ...]:
    """The transports auto may take in ``s``, best first (:data:`ORDER`); never empty
    (gloo always fits). A CUDA transport is first where one fits; the CPU transports
    follow (a CUDA machine without CuPy/NCCL runs on the CPU)."""
    return tuple(row.backend for row in ORDER if fits(row.backend, s))


def why(backend: Backend, auto: bool) -> str:
    """Why a communicator runs on ``backend``, in words: ``"asked for"`` where the caller
    named it, else auto's rule for it (:data:`ORDER`'s words)."""
    if not auto:
        return "asked for"
    rule = backend.row.where or "where no transport above it fits"
    return f"auto: {rule}"


def describe(markdown: bool = False) -> str:
    """What auto picks, in one sentence made from :data:`ORDER`: the ``--help`` text,
    and the sentence the README and the docs carry (``markdown``: names as code)."""
    name = (lambda b: f"`{b}`") if markdown else str
    rules = ", else ".join(f"{name(r.backend)} {r.where}".rstrip() for r in ORDER)
    survivors = " or ".join(name(b) for b in Backend if b.takes_a_replacement)
    only = f"only {survivors} where the job must outlive a dead rank"
    return f"{name('auto')}: {rules}; {only}"
