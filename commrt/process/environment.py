"""How this process was launched: rank and world size from mpiexec's or torchrun's
environment, and the bridge that lets torch's ``env://`` read MPI's variables."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Mapping

from commrt import settings


@dataclass(frozen=True)
class LaunchInfo:
    """Rank layout as the launcher announced it in the environment."""

    launcher: str  # "mpiexec", "torchrun" or "none"
    rank: int
    world_size: int
    local_rank: int
    local_size: int | None  # None when the launcher does not say
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
    allocation), unless :func:`mpi_env_for_torch` copied them from MPI's;
    without any launcher the process is rank 0 of 1.
    """
    env = os.environ if env is None else env
    port = _int(env, "MASTER_PORT")
    addr = env.get("MASTER_ADDR") or None
    mpi = settings.RANK_FROM_MPI
    copied = mpi.is_set(env) and env.get(mpi.name) == env.get("RANK")
    if "RANK" in env and "WORLD_SIZE" in env and not copied:
        return LaunchInfo(
            "torchrun",
            _int(env, "RANK"),
            _int(env, "WORLD_SIZE"),
            _int(env, "LOCAL_RANK") or 0,
            _int(env, "LOCAL_WORLD_SIZE"),
            addr,
            port,
        )
    rank = _int(env, "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
    size = _int(env, "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
    if rank is not None and size is not None:
        local_rank = _int(env, "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK") or 0
        local_size = _int(env, "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
        return LaunchInfo("mpiexec", rank, size, local_rank, local_size, addr, port)
    return LaunchInfo("none", 0, 1, 0, 1, addr, port)


def rejoining(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started to rejoin a running job (``COMMRT_REJOIN=1``)."""
    env = os.environ if env is None else env
    return env.get(settings.REJOIN.name, "") not in ("", "0")


def mpi_env_for_torch(env: "dict | None" = None) -> bool:
    """Under mpiexec with MASTER_ADDR and MASTER_PORT set (``mpiexec -genv``), fill in the
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE torch's ``env://`` reads, from MPI's
    variables; True if it did (:func:`detect_launch` still sees an mpiexec launch)."""
    env = os.environ if env is None else env
    if "RANK" in env or "WORLD_SIZE" in env:
        return False
    if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        return False  # not set up for env://: leave the environment as the launcher made it
    info = detect_launch(env)
    if info.launcher != "mpiexec":
        return False
    env.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size))
    env.setdefault("LOCAL_RANK", str(info.local_rank))
    if info.local_size is not None:
        env.setdefault("LOCAL_WORLD_SIZE", str(info.local_size))
    env[settings.RANK_FROM_MPI.name] = str(info.rank)
    return True


#: torch's own debug variable: INFO and DETAIL turn commrt's log on as ``info`` does
TORCH_DEBUG_ENV = "TORCH_DISTRIBUTED_DEBUG"


def log_level() -> str:
    """``off``, ``info`` or ``debug`` from ``COMMRT_LOG`` (else torch's debug variable);
    ValueError naming the variable for any other value."""
    given = settings.LOG.get()
    if given is None:
        torch_debug = os.environ.get(TORCH_DEBUG_ENV, "").strip().upper()
        return "info" if torch_debug in ("INFO", "DETAIL") else "off"
    return given


def warn_misspelt(rank: int, stacklevel: int = 3) -> None:
    """On rank 0: warn of each ``COMMRT_*`` variable that is nearly, but not, a setting
    (:func:`commrt.settings.misspelt`), naming the one it was probably meant to be."""
    if rank != 0:
        return
    for name, near in settings.misspelt():
        said = f"commrt: {name} is not a commrt setting and is ignored; did you mean {near}?"
        warnings.warn(said, RuntimeWarning, stacklevel=stacklevel)
