"""What tests plug into commrt: stand-ins for the engines under its device transports.

``commrt.init``'s arguments hold only what users set; a test that runs the NCCL or CUDA
IPC transport without a GPU plugs a stand-in in here instead, for the calls inside the
block (PyTorch's ``FakeProcessGroup`` plugs in through torch.distributed's backend
registry the same way)::

    import commrt
    from commrt.testing import engines

    with engines(nccl=StandInNccl()):
        comm = commrt.init("nccl", device="cpu")
    with engines(cuda_ipc=StandInDevice()):
        comm = commrt.init("cuda_ipc")

:func:`counted` says what the ``cuda_ipc`` transport waited on and launched during a
block (the counts issue 69 bounds: cross-process waits per peer, launches, host waits
for the stream)::

    with counted(comm) as counts:
        commrt.all_reduce(t, comm, algorithm="auto")
    assert max(counts.peer_waits.values()) <= 1

The project's own stand-ins live with its tests (``tests/helpers``: NCCL over gloo, a
strict NCCL that checks each call as NCCL would, a CUDA device over shared memory); they
run every family's oracle on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from typing import Iterator

from commrt.transports.stand_ins import plugged

__all__ = ["engines", "counted", "Counts"]


@contextlib.contextmanager
def engines(*, nccl=None, cuda_ipc=None) -> Iterator[None]:
    """Inside the block, ``commrt.init`` makes its NCCL transport over ``nccl`` (a module
    like ``cupy.cuda.nccl``) and its cuda_ipc transport over ``cuda_ipc`` (an
    :class:`~commrt.transports.cuda_ipc_device.IpcDevice`); None keeps the real engine."""
    given = {k: v for k, v in (("nccl", nccl), ("cuda_ipc", cuda_ipc)) if v is not None}
    with plugged(**given):
        yield


@dataclasses.dataclass
class Counts:
    """What a ``cuda_ipc`` transport did during a :func:`counted` block (filled at its end).

    ``peer_waits``: peer -> cross-process waits on it (a poll of its counter in
    ``/dev/shm``, a stream's wait on its IPC event); ``launches``: copies, sums and host
    functions enqueued on the transport's stream; ``stream_waits``: the host's waits for
    that stream (on CPU tensors every receive's, as the host reduces)."""

    peer_waits: Counter = dataclasses.field(default_factory=Counter)
    launches: int = 0
    stream_waits: int = 0


@contextlib.contextmanager
def counted(comm) -> Iterator[Counts]:
    """Count what ``comm``'s ``cuda_ipc`` transport waits on and launches inside the block."""
    from commrt.transports.cuda_ipc import CudaIpcTransport

    transport = comm.transport
    if not isinstance(transport, CudaIpcTransport):
        raise TypeError(f"counted() counts the cuda_ipc transport, not {transport.name}")
    tally, counts = transport.tally, Counts()
    waits, launches, stream_waits = Counter(tally.peer_waits), tally.launches, tally.stream_waits
    try:
        yield counts
    finally:
        counts.peer_waits = Counter(tally.peer_waits)
        counts.peer_waits.subtract(waits)
        counts.launches = tally.launches - launches
        counts.stream_waits = tally.stream_waits - stream_waits
