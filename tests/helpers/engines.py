"""``commrt.init`` over a stand-in engine, plugged in as users' tests would: through
:func:`commrt.testing.engines`, not ``init``'s arguments."""

from __future__ import annotations

import commrt
from commrt.testing import engines


def init_with(backend: str, engine, **kwargs) -> commrt.Communicator:
    """``commrt.init(backend, **kwargs)`` with ``engine`` (None: the real one) under
    ``backend``'s transport: an NCCL module for "nccl", an IPC device for "cuda_ipc"."""
    with engines(**{backend: engine}):
        return commrt.init(backend, **kwargs)
