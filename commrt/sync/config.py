"""What a :class:`~commrt.GradientSync` was asked to do, checked once.

:meth:`SyncConfig.from_args` turns the constructor's arguments into one
frozen object, raising the same ``TypeError``/``ValueError`` a user has
always seen for a bad argument, so the rest of GradientSync never
re-checks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from commrt.algorithms import Algorithm, resolve
from commrt.kernels import SUPPORTED_DTYPES
from commrt.runtime.communicator import Communicator
from commrt.sync.buckets import MB
from commrt.sync.unused import Unused


@dataclass(frozen=True)
class SyncConfig:
    """The validated arguments of :class:`~commrt.GradientSync` (see its docs for each)."""

    algorithm: Algorithm
    bucket_mb: float
    first_bucket_mb: float
    comm_dtype: torch.dtype
    unused: Unused
    grad_views: bool
    broadcast_init: bool
    broadcast_buffers: bool

    @property
    def element_size(self) -> int:
        """Bytes per element on the wire."""
        return torch.empty((), dtype=self.comm_dtype).element_size()

    @classmethod
    def from_args(
        cls,
        model,
        comm,
        algorithm,
        bucket_mb,
        first_bucket_mb,
        comm_dtype,
        *,
        unused,
        grad_views,
        broadcast_init,
        broadcast_buffers,
    ) -> "SyncConfig":
        """Check the constructor's arguments in the order users meet the errors."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(comm, Communicator):
            raise TypeError(
                f"comm must be a commrt.Communicator (from commrt.init), got {type(comm).__name__}"
            )
        comm.check_open()
        for name, v in (("bucket_mb", bucket_mb), ("first_bucket_mb", first_bucket_mb)):
            problem = bucket_mb_problem(v)
            if problem:
                raise ValueError(f"{name} {problem}, got {v!r}")
        try:
            unused = Unused(unused) if not isinstance(unused, Unused) else unused
        except ValueError:
            raise ValueError(f"unused must be 'zeros' or 'error', got {unused!r}") from None
        comm_dtype = _wire_dtype(trainable(model), comm, comm_dtype)
        return cls(
            resolve(algorithm),
            bucket_mb,
            first_bucket_mb,
            comm_dtype,
            unused,
            bool(grad_views),
            bool(broadcast_init),
            bool(broadcast_buffers),
        )


def bucket_mb_problem(v) -> str | None:
    """Why ``v`` MB is not a usable bucket cap, or None: it must be a finite number that
    comes to at least one byte (a cap below one parameter's bytes gives it its own bucket)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        return "must be a positive number of MB"
    if int(v * MB) < 1:
        return f"is less than one byte (1 MB = 2**20 bytes); give at least {1 / MB:.2g}"
    return None


def trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters GradientSync synchronises: those that require grad, by name."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _wire_dtype(named, comm, comm_dtype: torch.dtype | None) -> torch.dtype:
    """Check the parameters against the communicator; the wire dtype (asked, else theirs)."""
    if not named:
        raise ValueError("the model has no parameters that require grad: nothing to synchronise")
    supported = ", ".join(map(str, SUPPORTED_DTYPES))
    for n, p in named:
        if p.device.type != comm.device.type:
            raise ValueError(
                f"parameter {n} is on {p.device} but the {comm.backend.value} "
                f"communicator works on {comm.device}; move the model first"
            )
        if p.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"parameter {n} has dtype {p.dtype}; GradientSync handles {supported}")
    dtypes = {p.dtype for _, p in named}
    if comm_dtype is None:
        # mixed parameter dtypes travel in fp32, which holds each of them
        comm_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    if comm_dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"comm_dtype must be one of {supported}, got {comm_dtype}")
    return comm_dtype
