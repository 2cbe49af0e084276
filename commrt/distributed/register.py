"""The ``"commrt"`` torch.distributed backend: registration and the group factory.

``import commrt`` calls :func:`register` (cheap: no process group, no
thread, no transport is made until ``init_process_group("commrt")``).
torch calls :func:`make_group` once per group (the default group, every
``new_group``, each DeviceMesh dimension) with the group's store, rank,
size, timeout and ``pg_options`` (a :class:`~commrt.distributed.Options`).

Under mpiexec, registration also copies MPI's rank and size into RANK,
WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE where they are missing, so that
torch's ``env://`` rendezvous works there (MASTER_ADDR and MASTER_PORT still
come from the launch command); see :func:`commrt.process.environment.mpi_env_for_torch`.
"""

from __future__ import annotations

import atexit
import sys

import torch.distributed as dist

from commrt.distributed.torch_api import register_backend
from commrt.process.environment import mpi_env_for_torch

BACKEND_NAME = "commrt"


def make_group(backend_opts, pg_options=None):
    """torch's factory (``extended_api=True``): the group for these options. A setting it
    refuses (a ValueError naming it) also goes to torchrun's error file, where there is
    one, so that torchrun's "Root Cause" block says it."""
    from commrt.process.elastic import record_error

    try:
        return _make_group(backend_opts, pg_options)
    except ValueError as e:
        record_error(f"{type(e).__name__}: {e}")
        raise


def _make_group(backend_opts, pg_options):
    from commrt.distributed.devices import DeviceComms
    from commrt.distributed.group import ProcessGroupCommrt
    from commrt.process.environment import log_level, warn_misspelt

    log_level()  # a COMMRT_LOG it cannot read is refused before anything is made
    warn_misspelt(backend_opts.group_rank)
    if backend_opts.group_size > 1:  # once a process, whatever the number of groups
        atexit.unregister(warn_lone_accelerator)
        atexit.register(warn_lone_accelerator, backend_opts.group_size)
    devices = DeviceComms(
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.timeout,
        pg_options,
        str(backend_opts.group_id),
        list(backend_opts.global_ranks_in_group),
    )
    return ProcessGroupCommrt(devices)


def warn_lone_accelerator(world_size: int) -> None:
    """At exit: warn when Accelerate ran this job as one process although a commrt group of
    ``world_size`` ranks existed. ``Accelerator()`` on a machine without a GPU keeps
    ``DistributedType.NO`` unless ``cpu=True``: it never wraps the model, every rank trains
    alone and the job ends without an error. Reads Accelerate's shared state only."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None) or {}
    kind = shared.get("distributed_type")
    if kind is None or str(kind).rsplit(".", 1)[-1] != "NO":
        return
    print(
        f"commrt: warning: a commrt group of {world_size} ranks existed, but Accelerate ran "
        "this rank alone (DistributedType.NO: the model was not wrapped, nothing was "
        "all-reduced); on a machine without a GPU pass Accelerator(cpu=True)",
        file=sys.stderr,
        flush=True,
    )


def register() -> None:
    """Register the ``"commrt"`` backend with torch.distributed (idempotent)."""
    if not dist.is_available():
        return
    mpi_env_for_torch()
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    register_backend(BACKEND_NAME, make_group, devices=["cpu", "cuda"])
