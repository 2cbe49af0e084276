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

The project's own stand-ins live with its tests (``tests/helpers``: NCCL over gloo, a
strict NCCL that checks each call as NCCL would, a CUDA device over shared memory); they
run every family's oracle on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from commrt.transports.stand_ins import plugged

__all__ = ["engines"]


@contextlib.contextmanager
def engines(*, nccl=None, cuda_ipc=None) -> Iterator[None]:
    """Inside the block, ``commrt.init`` makes its NCCL transport over ``nccl`` (a module
    like ``cupy.cuda.nccl``) and its cuda_ipc transport over ``cuda_ipc`` (an
    :class:`~commrt.transports.cuda_ipc_device.IpcDevice`); None keeps the real engine."""
    given = {k: v for k, v in (("nccl", nccl), ("cuda_ipc", cuda_ipc)) if v is not None}
    with plugged(**given):
        yield
