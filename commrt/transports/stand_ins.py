"""The engines under the device transports, replaceable for tests.

NCCL's transport drives ``cupy.cuda.nccl``, cuda_ipc's a CUDA device (an
:class:`~commrt.transports.cuda_ipc_device.IpcDevice`). The tests run both on a machine
without a GPU through stand-ins plugged in here, as PyTorch's ``FakeProcessGroup`` plugs
in through torch.distributed's public backend registry: ``commrt.init``'s signature holds
only what users set. :func:`commrt.testing.engines` is the public way in; what is plugged
in holds for the ``commrt.init`` calls inside it, in this thread (a context variable).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

#: the transports whose engine a stand-in may replace (their backends' names)
KINDS = ("nccl", "cuda_ipc")
_plugged: ContextVar[dict | None] = ContextVar("commrt_stand_ins", default=None)


def stand_in(kind: str):
    """The engine plugged in for ``kind`` (one of :data:`KINDS`), else None: the real one."""
    plugged = _plugged.get()
    return None if plugged is None else plugged.get(kind)


@contextlib.contextmanager
def plugged(**engines) -> Iterator[None]:
    """Inside: ``engines[kind]`` (None: the real one) replaces the engine of each kind
    named; the kinds not named keep the engines plugged in around this one."""
    unknown = sorted(set(engines) - set(KINDS))
    if unknown:
        raise TypeError(f"commrt: no engine {unknown[0]!r} to replace; there are {KINDS}")
    token = _plugged.set({**(_plugged.get() or {}), **engines})
    try:
        yield
    finally:
        _plugged.reset(token)
