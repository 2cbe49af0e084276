"""The transport interface: grouped non-blocking point-to-point, wait, barrier.

A transport moves bytes and nothing else; every reduction is done by the
executor with commrt's kernels, so one schedule runs unchanged on NCCL,
MPI and gloo. Waits never block without a bound: :func:`poll_until`
polls (spinning for ``spin_s`` first, if asked), yields the core between
polls, then sleeps with growing pauses, until the deadline.
"""

from __future__ import annotations

import abc
import contextlib
import os
import time
from dataclasses import replace
from typing import Callable, Sequence

import torch

from commrt import settings
from commrt.transports.traits import Traits

Pair = tuple[torch.Tensor, int]  # (contiguous tensor, peer rank)


CHECK_EVERY_S = settings.Seconds(
    0.02,
    "how often a long wait asks whether a peer has left",
    "every transport's waits",
    settings.STALLS,
)
NATIVE_S = settings.Seconds(
    300.0,
    "how long a transport's own direct all-reduce (the oracle the schedules are tested "
    "against) waits for its peers",
    "the shm and cuda_ipc transports' `native_all_reduce`",
    settings.STALLS,
)
#: what every refusal of a GPU-only backend on a machine without one suggests instead
ON_A_CPU = "on a CPU use backend='shm', 'gloo' or 'mpi'"


def average_factor(world_size: int) -> float:
    """What each rank's input is multiplied by for an average over ``world_size`` ranks.

    The one rule of AVG in commrt, on every path (the collectives, GradientSync, the DDP
    hook, ``average_parameters``, each transport's native all-reduce): the 1/p is applied
    to every input *before* the sum, in the input's dtype (the pack kernel applies it to
    GradientSync's buckets), never divided out after it, so an fp16 or bf16 sum whose
    average fits cannot overflow on the way."""
    return 1.0 / world_size


def average_first(tensor: torch.Tensor, op: str, world_size: int) -> None:
    """Apply the rule of :func:`average_factor` to ``tensor`` in place where ``op`` is
    ``"avg"`` over more than one rank: a native all-reduce then sums it as it is."""
    if op == "avg" and world_size > 1:
        tensor.mul_(average_factor(world_size))


def exchange_barrier(transport: "Transport", timeout: float, tag: int) -> bool:
    """A barrier made of point-to-point calls: an empty message to and from every peer
    on ``tag``, then the transport's stream synced; False at ``timeout``."""
    deadline = time.monotonic() + timeout
    empty = torch.empty(0, dtype=torch.uint8, device=transport.device)
    peers = [r for r in range(transport.world_size) if r != transport.rank]
    pend = transport.exchange([(empty, r) for r in peers], [(empty, r) for r in peers], tag)
    waited = all(pend.wait_recv(i, deadline) for i in range(len(peers)))
    waited = waited and all(pend.wait_send(i, deadline) for i in range(len(peers)))
    return waited and transport.sync(deadline)


def ordered_sum(transport: "Transport", tensor: torch.Tensor, op: str, tag: int) -> None:
    """``transport``'s own direct all-reduce, the oracle the schedules are tested against
    (not a tuned algorithm): every rank sends its tensor to every other on ``tag`` and sums
    all of them in rank order, so every rank's result is the same to the bit. An average
    is scaled first (:func:`average_first`). Raises
    :class:`~commrt.errors.CommTimeoutError` after :data:`NATIVE_S`, naming the peer."""
    from commrt.errors import CommTimeoutError

    p, rank = transport.world_size, transport.rank
    average_first(tensor, op, p)  # the rule: scaled before the sum
    if p == 1:
        return
    deadline = time.monotonic() + NATIVE_S
    peers = [r for r in range(p) if r != rank]
    theirs = {r: torch.empty_like(tensor) for r in peers}
    transport.begin(tensor)
    pend = transport.exchange([(tensor, r) for r in peers], [(theirs[r], r) for r in peers], tag)
    for i, peer in enumerate(peers):  # every send done before ``tensor`` changes
        if not (pend.wait_recv(i, deadline) and pend.wait_send(i, deadline)):
            raise CommTimeoutError(
                rank=rank, peer=peer, what="native all-reduce", timeout_s=NATIVE_S
            )
    if not transport.sync(deadline):
        raise CommTimeoutError(rank=rank, peer=None, what="native all-reduce", timeout_s=NATIVE_S)
    transport.end(tensor)
    acc = tensor.clone() if rank == 0 else theirs[0]
    for r in range(1, p):
        acc.add_(tensor if r == rank else theirs[r])
    tensor.copy_(acc)


def poll_until(
    done: Callable[[], bool],
    deadline: float,
    spin_s: float = 0.0,
    check: Callable[[], None] | None = None,
    moving: Callable[[], bool] | None = None,
) -> bool:
    """Call ``done()`` until it returns True or ``time.monotonic()`` passes ``deadline``.

    Returns whether it finished. A message that is already there costs one
    call. Then, for ``spin_s`` seconds, ``done()`` is polled back to back: a
    caller with nothing else to do and a core of its own (see
    :attr:`commrt.Communicator.spin_s`) catches a reply that is microseconds
    away without giving its core to another process for a time slice.
    After that (and at once when ``spin_s`` is 0) the core is yielded
    (``sched_yield``) rather than spun on: with more ranks than cores (as in
    tests and on small CI machines) the peer we wait for may need this very
    core, and a spinning waiter would keep it from running. When nothing
    else is runnable the yield returns at once, so an idle machine still
    gets spin-like latency.
    After 5 ms the wait turns into sleeps of up to 1 ms, so a long wait (a
    slow peer, a straggler) costs no CPU. From then on ``check()`` (if given)
    is called every :data:`CHECK_EVERY_S`; it raises to end a wait that can
    never finish (a peer closed, see :mod:`commrt.diagnosis.departures`).
    ``moving()`` (if given) says, after a miss, whether the wait's transfer moved
    since the last call; if it did, the wait goes back to yielding instead of
    sleeping. A transport whose waiter moves the bytes itself (shared memory)
    would otherwise sleep between the pieces of a long message it is copying.
    """
    if done():
        return True
    start = time.monotonic()
    if spin_s > 0:
        end = start + min(spin_s, deadline - start)
        while True:
            if done():
                return True
            if time.monotonic() > end:
                break
        start = time.monotonic()
    next_check = start + 5e-3
    while True:
        if done():
            return True
        now = time.monotonic()
        if now > deadline:
            return done()
        if moving is not None and moving():
            start = now
        waited = now - start
        if waited < 5e-3:
            os.sched_yield()
            continue
        if check is not None and now >= next_check:
            check()
            next_check = now + CHECK_EVERY_S
        time.sleep(min(1e-3, waited / 50))


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

    def cancel(self) -> None:
        """Withdraw operations that have not finished (where the engine can)."""


class Prepared:
    """Operations of one step bound to fixed buffers, started again and again.

    The default re-issues :meth:`Transport.exchange` on every start;
    transports with cheaper repeat paths (MPI persistent requests) override
    :meth:`Transport.prepare`.
    """

    __slots__ = ("transport", "sends", "recvs", "tag")

    def __init__(
        self, transport: "Transport", sends: Sequence[Pair], recvs: Sequence[Pair], tag: int
    ):
        self.transport, self.sends, self.recvs, self.tag = transport, list(sends), list(recvs), tag

    def start(self, spin_s: float = 0.0) -> Pending:
        """Start the operations; the returned waits may spin for ``spin_s`` before yielding
        (:func:`poll_until`), where the transport polls at all."""
        return self.transport.exchange(self.sends, self.recvs, self.tag)

    def free(self) -> None:
        """Release engine resources held for these buffers."""


class Transport(abc.ABC):
    """Grouped non-blocking sends and receives of contiguous tensors."""

    #: "mpi", "gloo" or "nccl"
    name: str
    #: what this transport is (:class:`Traits`); each transport class declares its own
    traits: Traits = Traits()
    #: the rendezvous store (a ``torch.distributed.Store``) the transport was built from, or
    #: None where there is none (MPI, NCCL): a closing rank's farewell and the stall watch
    #: meet in it (commrt.diagnosis.departures, commrt.diagnosis.stall)
    store = None
    #: the communicator's record of peers that left (commrt.diagnosis.departures.Departures), or
    #: None; bounded waits call its ``check()`` and engine errors its ``explain()``
    departures = None

    def __init__(self, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device

    @abc.abstractmethod
    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        """Start all ``sends`` and ``recvs`` as one group; return at once."""

    def prepare(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Prepared:
        """Bind a step's sends and receives to their buffers for repeated starts."""
        return Prepared(self, sends, recvs, tag)

    def prepare_adding(
        self, sends: Sequence[Pair], recvs: Sequence[Pair], adds: tuple, tag: int
    ) -> Prepared:
        """:meth:`prepare`, where receive ``i`` with ``adds[i]`` True adds its data into its
        tensor (elementwise, in the tensor's dtype) instead of overwriting it. Only
        transports whose :attr:`Traits.adds_on_receive` is set implement it."""
        raise NotImplementedError(f"the {self.name} transport cannot add on receive")

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

    def runs_whole(self, schedule, buf: torch.Tensor, reduce) -> bool:
        """Whether :meth:`run_whole` runs ``schedule`` on ``buf`` as one fused operation of
        the engine's own (``cuda_ipc``'s one-shot workspace) instead of step by step;
        ``reduce`` is the run's (None: the sum). Default: never. A wrapper
        (:class:`Forwarding`) keeps the default, so it sees every message."""
        return False

    def run_whole(self, buf: torch.Tensor, deadline: float) -> int | None:
        """Enqueue the schedule :meth:`runs_whole` accepted on ``buf`` (inside
        :meth:`stream`, between :meth:`begin` and :meth:`sync`); the peer a wait timed out
        on, or None once all is enqueued."""
        raise NotImplementedError(f"the {self.name} transport runs schedules step by step")

    def attach_departures(self, departures) -> None:
        """Let this transport's waits ask ``departures`` whether a peer has left."""
        self.departures = departures

    def waiting_check(self):
        """What a long wait calls now and then (None: nothing to check)."""
        departures = self.departures
        return None if departures is None else departures.check

    def close(self) -> None:
        """Release engine resources; idempotent."""


class ForwardingPending(Pending):
    """``inner``'s operations as they are: the base of a wrapper's Pending that changes
    some of its waits."""

    def __init__(self, inner: Pending):
        self.inner = inner

    def wait_recv(self, i: int, deadline: float) -> bool:
        return self.inner.wait_recv(i, deadline)

    def wait_send(self, i: int, deadline: float) -> bool:
        return self.inner.wait_send(i, deadline)

    def finish(self) -> None:
        self.inner.finish()

    def cancel(self) -> None:
        self.inner.cancel()


class Forwarding(Transport):
    """A transport that hands every operation to ``inner`` as it is, under ``inner``'s name
    and with its stream and timeout properties: the base of wrappers (counting the bytes
    sent, bounding gloo's waits, the tests' faults) that override what they change.

    A repeated step goes through the wrapper's :meth:`exchange` (the default
    :meth:`Transport.prepare`), not ``inner``'s prepared operations, so a wrapper that
    changes :meth:`exchange` changes every start; receives never add on arrival here."""

    # what the transport is, it stays through a wrapper: a wrapper changes operations (a
    # counted MPI transport still takes gossip's MPI path), its name and store are inner's
    name = property(lambda self: self.inner.name)
    store = property(lambda self: self.inner.store)

    def __init__(self, inner: Transport):
        super().__init__(inner.rank, inner.world_size, inner.device)
        self.inner = inner
        # inner's traits whole, but two of the wrapper's own: receives go through exchange()
        # here, as the class says, so none adds on arrival; run_whole keeps its default, so
        # the wrapper sees every message and never fuses the one-shot
        self.traits = replace(inner.traits, adds_on_receive=False, fuses_one_shot=False)

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        return self.inner.exchange(sends, recvs, tag)

    def barrier(self, timeout: float) -> bool:
        return self.inner.barrier(timeout)

    def native_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        self.inner.native_all_reduce(tensor, op)

    def stream(self) -> contextlib.AbstractContextManager:
        return self.inner.stream()

    def begin(self, tensor: torch.Tensor) -> None:
        self.inner.begin(tensor)

    def end(self, tensor: torch.Tensor) -> None:
        self.inner.end(tensor)

    def sync(self, deadline: float) -> bool:
        return self.inner.sync(deadline)

    def close(self) -> None:
        self.inner.close()
