"""What :class:`~commrt.transports.nccl.NcclTransport` calls of ``cupy.cuda.nccl``,
declared in one place.

:class:`NcclModule` declares the module's calls the transport makes, and what a CPU
stand-in may model besides (a host stream, stream-like completion); :class:`NcclComm`
declares a communicator's. :class:`CupyNccl` hands each call to cupy. A stand-in that
moves host bytes (the tests' ``helpers.nccl_standin`` and ``helpers.nccl_strict``)
subclasses :class:`NcclModule`, so the transport asks for no capability by name.
"""

from __future__ import annotations

import abc
from typing import Protocol


class NcclComm(Protocol):
    """One NCCL communicator, as ``cupy.cuda.nccl.NcclCommunicator`` has it. Pointers,
    counts, dtype codes, ops and streams are plain integers."""

    def send(self, ptr: int, count: int, datatype: int, peer: int, stream: int) -> None:
        """Enqueue a send of ``count`` elements at ``ptr`` to ``peer`` on ``stream``."""

    def recv(self, ptr: int, count: int, datatype: int, peer: int, stream: int) -> None:
        """Enqueue a receive of ``count`` elements into ``ptr`` from ``peer``."""

    def allReduce(  # noqa: N802 (cupy's name)
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int
    ) -> None:
        """Enqueue NCCL's own all-reduce (the oracle and the benchmark baseline)."""

    def check_async_error(self) -> None:
        """Raise the error NCCL recorded asynchronously (a peer's network failure)."""

    def abort(self) -> None:
        """Abort the communicator and its pending operations (may block: bounded by the
        caller)."""

    def destroy(self) -> None:
        """Free the communicator once its work is done (waits for the other ranks)."""


class NcclModule(abc.ABC):
    """The calls the transport makes on ``cupy.cuda.nccl``, each declared here."""

    #: True where a group's completion is seen as on a CUDA stream although the device is
    #: a CPU (a stand-in that models it): the transport then does not wait on the host for
    #: a group, and only the caller's own host wait (``sync()``) sees a receive land
    device_streams: bool = False

    @abc.abstractmethod
    def get_unique_id(self):
        """A new unique id (128 bytes, or cupy 13's tuple of 128 signed chars)."""

    @abc.abstractmethod
    def groupStart(self) -> None:  # noqa: N802 (cupy's name)
        """Open a group: the calls until :meth:`groupEnd` launch together."""

    @abc.abstractmethod
    def groupEnd(self) -> None:  # noqa: N802 (cupy's name)
        """Close the group and launch its calls (may block connecting a new pair)."""

    @abc.abstractmethod
    def NcclCommunicator(self, ndev: int, commId, rank: int) -> NcclComm:  # noqa: N802,N803
        """A new communicator of ``ndev`` ranks (collective over them)."""

    def HostStream(self):  # noqa: N802 (named like the module's other calls)
        """A host stream that orders a CPU device's operations (with ``ptr`` and
        ``record()``, whose event has ``query()``), or None where there is none: cupy
        has only CUDA streams, which the transport takes from torch."""
        return None


class CupyNccl(NcclModule):
    """cupy's ``cupy.cuda.nccl``, each call handed to it."""

    def __init__(self, module):
        #: the ``cupy.cuda.nccl`` module
        self.module = module

    def get_unique_id(self):
        return self.module.get_unique_id()

    def groupStart(self) -> None:  # noqa: N802
        self.module.groupStart()

    def groupEnd(self) -> None:  # noqa: N802
        self.module.groupEnd()

    def NcclCommunicator(self, ndev: int, commId, rank: int) -> NcclComm:  # noqa: N802,N803
        return self.module.NcclCommunicator(ndev, commId, rank)
