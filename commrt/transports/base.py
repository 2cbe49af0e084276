"""The transport interface: grouped non-blocking point-to-point, wait, barrier.

A transport moves bytes and nothing else; every reduction is done by the
executor with commrt's kernels, so one schedule runs unchanged on NCCL,
MPI and gloo. Waits never block without a bound: :func:`poll_until`
spins briefly (cheap for the short waits of small messages), then yields
and sleeps with growing pauses until the deadline.
"""
from __future__ import annotations

import abc
import contextlib
import time
from typing import Callable, Sequence

import torch

Pair = tuple[torch.Tensor, int]   # (contiguous tensor, peer rank)


def poll_until(done: Callable[[], bool], deadline: float) -> bool:
    """Call ``done()`` until it returns True or ``time.monotonic()`` passes ``deadline``.

    Returns whether it finished. Spins for ~50 µs first, then yields the
    core, then sleeps up to 1 ms between polls, so that ranks sharing cores
    (more ranks than cores in tests) still make progress.
    """
    if done():
        return True
    start = time.monotonic()
    spins = 0
    while True:
        if done():
            return True
        now = time.monotonic()
        if now > deadline:
            return done()
        waited = now - start
        spins += 1
        if waited < 5e-5:
            continue
        time.sleep(0 if waited < 2e-3 else min(1e-3, waited / 50))


class Pending(abc.ABC):
    """Operations started by one :meth:`Transport.exchange` call."""

    @abc.abstractmethod
    def wait_recv(self, i: int, deadline: float) -> bool:
        """Wait until receive ``i`` (in exchange order) landed; False at the deadline."""

    @abc.abstractmethod
    def wait_send(self, i: int, deadline: float) -> bool:
        """Wait until send ``i``'s buffer may be reused; False at the deadline."""

    def finish(self) -> None:
        """Raise any error the engine reported for the finished operations."""


class Transport(abc.ABC):
    """Grouped non-blocking sends and receives of contiguous tensors."""

    #: "mpi", "gloo" or "nccl"
    name: str
    #: True where the engine orders operations on a device stream (NCCL):
    #: the executor then enqueues reductions after a receive without a host
    #: wait, and only the final :meth:`Pending` completion is waited on.
    stream_ordered: bool = False

    def __init__(self, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device

    @abc.abstractmethod
    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        """Start all ``sends`` and ``recvs`` as one group; return at once."""

    @abc.abstractmethod
    def barrier(self, timeout: float) -> bool:
        """Wait for every rank; False if ``timeout`` seconds passed first."""

    @abc.abstractmethod
    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """The engine's own all-reduce, in place (the oracle and the benchmark baseline)."""

    def stream(self) -> contextlib.AbstractContextManager:
        """Context in which the executor enqueues its reductions (a CUDA stream for NCCL)."""
        return contextlib.nullcontext()

    def begin(self, tensor: torch.Tensor) -> None:
        """Order the transport's work after the caller's writes to ``tensor``."""

    def end(self, tensor: torch.Tensor) -> None:
        """Order the caller's later work after the transport's writes to ``tensor``."""

    def sync(self, deadline: float) -> bool:
        """For stream-ordered transports: wait (bounded) until enqueued work ran."""
        return True

    def close(self) -> None:
        """Release engine resources; idempotent."""
