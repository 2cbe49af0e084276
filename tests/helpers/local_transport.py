"""An in-process transport: ranks are threads, messages are tensor copies.

It lets the executor's plan, piece and scratch logic run for many world
sizes in milliseconds. Sends are buffered at post time (like MPI eager
sends), so a step's sends always read the buffer as it was before the step;
that is exactly the contract schedules are written against.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

import torch

from commrt.transports.base import Pending, Transport


class Mailbox:
    def __init__(self, world_size: int | None = None):
        self.cv = threading.Condition()
        self.queues = defaultdict(deque)  # (src, dst, tag) -> deque of tensors
        # the ranks' barrier, where the box knows how many there are
        self.gate = threading.Barrier(world_size) if world_size else None


class _Pending(Pending):
    def __init__(self, box, recvs, rank, tag):
        self.box, self.recvs, self.rank, self.tag = box, recvs, rank, tag

    def wait_recv(self, i, deadline):
        t, peer = self.recvs[i]
        key = (peer, self.rank, self.tag)
        with self.box.cv:
            while not self.box.queues[key]:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.box.cv.wait(left)
            data = self.box.queues[key].popleft()
        if data.numel() != t.numel():
            raise RuntimeError(
                f"size mismatch: rank {self.rank} expects {t.numel()} from {peer}, got {data.numel()}"
            )
        t.copy_(data)
        return True

    def wait_send(self, i, deadline):
        return True


class LocalTransport(Transport):
    name = "local"

    def __init__(self, box: Mailbox, rank: int, world_size: int):
        super().__init__(rank, world_size, torch.device("cpu"))
        self.box = box
        self.sent_bytes = 0

    def exchange(self, sends, recvs, tag):
        with self.box.cv:
            for t, peer in sends:
                self.box.queues[(self.rank, peer, tag)].append(t.clone())
                self.sent_bytes += t.numel() * t.element_size()
            self.box.cv.notify_all()
        return _Pending(self.box, list(recvs), self.rank, tag)

    def barrier(self, timeout):
        if self.box.gate is None:
            raise NotImplementedError("a barrier needs Mailbox(world_size)")
        try:
            self.box.gate.wait(timeout)
        except threading.BrokenBarrierError:
            return False
        return True

    def native_all_reduce(self, tensor, op="sum"):
        raise NotImplementedError


def run_ranks(world_size, fn):
    """Run ``fn(transport)`` on ``world_size`` threads; return their results in rank order."""
    box = Mailbox(world_size)
    return on_threads(world_size, lambda r: fn(LocalTransport(box, r, world_size)))


def on_threads(world_size, body):
    """Run ``body(rank)`` on ``world_size`` threads; return their results in rank order and
    raise the first rank's error, in the caller's thread."""
    results, errors = [None] * world_size, []

    def run(r):
        try:
            results[r] = body(r)
        except BaseException as e:  # surfaced below, in the test thread
            errors.append((r, e))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0][1]
    return results
