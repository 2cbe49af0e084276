"""A transport wrapper that counts what leaves this rank: messages, bytes, per peer.

Wrap a communicator's transport to see how many point-to-point messages an
algorithm really sends (tests and benchmarks use it to show that gossip
sends O(1) messages per bucket while a ring sends 2(p−1))::

    >>> from commrt.transports.counting import CountingTransport
    >>> comm.transport = counter = CountingTransport(comm.transport)   # doctest: +SKIP
    >>> # ... the collectives to count, then:
    >>> counter.messages, counter.bytes, counter.by_peer               # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from commrt.transports.base import Forwarding, Pair, Pending, Prepared, Transport


class _CountingPrepared(Prepared):
    __slots__ = ("inner", "counter")

    def __init__(self, counter: "CountingTransport", inner: Prepared, sends: Sequence[Pair]):
        super().__init__(counter, sends, inner.recvs, inner.tag)
        self.inner, self.counter = inner, counter

    def start(self, spin_s: float = 0.0) -> Pending:
        self.counter.count(self.sends)
        return self.inner.start(spin_s)

    def free(self) -> None:
        self.inner.free()


class CountingTransport(Forwarding):
    """Forwards everything to ``inner`` and counts every send it starts."""

    def __init__(self, inner: Transport):
        super().__init__(inner)
        self.reset()

    def reset(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.by_peer: Counter = Counter()  # messages sent to each peer
        self.bytes_by_peer: Counter = Counter()  # bytes sent to each peer

    def count(self, sends: Sequence[Pair]) -> None:
        for t, peer in sends:
            nbytes = t.numel() * t.element_size()
            self.messages += 1
            self.bytes += nbytes
            self.by_peer[peer] += 1
            self.bytes_by_peer[peer] += nbytes

    def exchange(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Pending:
        self.count(sends)
        return self.inner.exchange(sends, recvs, tag)

    def prepare(self, sends: Sequence[Pair], recvs: Sequence[Pair], tag: int) -> Prepared:
        return _CountingPrepared(self, self.inner.prepare(sends, recvs, tag), sends)
