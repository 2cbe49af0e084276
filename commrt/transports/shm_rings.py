"""The rings and message matching of the shared-memory transport
(:mod:`commrt.transports.shm`, whose module docs give the layout and the rules).

:class:`Ring` is one direction between two ranks in the shared file; :class:`Op` one
send or receive; :class:`Inbound` what one peer sends this rank: the message being read,
the receives posted for it and those that came first. All of it runs under the
transport's lock, except the counters' reads a poll makes.
"""

from __future__ import annotations

import mmap
from collections import deque

import numpy as np

#: the bytes before a ring's data: the writer's counter, then the reader's, a cache line apart
RING_HEAD = 128
#: where the ring files live
SHM_DIR = "/dev/shm"
#: a ring's data bytes, unless /dev/shm is too small for every rank's rings
RING_BYTES = 1 << 20
#: the smallest ring worth having (a header and a little data)
MIN_RING_BYTES = 64 << 10
#: architectures whose stores and loads keep their program order (see
#: :mod:`commrt.transports.shm`'s docs)
ORDERED_ARCHES = ("x86_64", "amd64")
#: an adding receive up to this size is staged (:attr:`Op.staged`)
STAGED_BYTES = 4096


def pad(n: int) -> int:
    return (n + 15) & ~15


class Ring:
    """One direction between two ranks: the counters and the data, as numpy views."""

    __slots__ = ("tail", "head", "data", "bytes", "words", "size")

    def __init__(self, mm: mmap.mmap, offset: int, size: int):
        # counters, headers and copies through memoryviews: an index reads or writes one
        # aligned 8-byte word as a Python int, and a slice copies without making numpy
        # views, several times cheaper than numpy for the few bytes of a small message;
        # numpy's view of the data is for adding into a receive
        mem = memoryview(mm)
        self.tail = mem[offset : offset + 8].cast("Q")
        self.head = mem[offset + 64 : offset + 72].cast("Q")
        self.bytes = mem[offset + RING_HEAD : offset + RING_HEAD + size]
        self.words = self.bytes.cast("q")
        self.data = np.frombuffer(mm, np.uint8, size, offset + RING_HEAD)
        self.size = size

    def put(self, pos: int, src: memoryview) -> None:
        at, n = pos % self.size, len(src)
        first = min(n, self.size - at)
        self.bytes[at : at + first] = src[:first]
        if first < n:
            self.bytes[: n - first] = src[first:]

    def get(self, pos: int, dst: memoryview) -> None:
        at, n = pos % self.size, len(dst)
        first = min(n, self.size - at)
        dst[:first] = self.bytes[at : at + first]
        if first < n:
            dst[first:] = self.bytes[: n - first]

    def add(self, pos: int, dst: np.ndarray) -> None:
        """dst += the ring's bytes at ``pos`` read as dst's dtype (positions are 16-aligned,
        so an element never straddles the ring's end)."""
        at, size = pos % self.size, dst.itemsize
        n = min(len(dst), (self.size - at) // size)
        np.add(dst[:n], self.data[at : at + n * size].view(dst.dtype), out=dst[:n])
        if n < len(dst):
            rest = dst[n:]
            np.add(rest, self.data[: len(rest) * size].view(dst.dtype), out=rest)


class Op:
    """One send or receive: its bytes, how far it got, and whether it is done."""

    __slots__ = ("buf", "mem", "n", "end", "peer", "tag", "off", "done", "elems", "staged")

    def __init__(self, buf: np.ndarray, peer: int, tag: int, elems: np.ndarray | None = None):
        self.buf, self.peer, self.tag = buf, peer, tag
        self.mem = memoryview(buf)  # the same bytes, for the rings' copies
        self.n = len(buf)
        self.end = pad(self.n)  # where the message's bytes end in the ring
        self.off = -1  # a send: -1 until its header is in the ring; a receive: unused
        self.done = False
        #: a receive that adds: its tensor as elements of its dtype (None: it overwrites)
        self.elems = elems
        #: a small adding receive: its bytes are copied here, then added in. Two numpy calls
        #: on arrays made once cost half of the views of the ring a direct add makes per
        #: message, which is most of a small message's time (None: added from the ring)
        self.staged = None
        if elems is not None and self.n <= STAGED_BYTES:
            staged = np.empty(self.n, np.uint8)
            self.staged = (memoryview(staged), staged.view(elems.dtype))


class Truncated(RuntimeError):
    """A message longer or shorter than the receive posted for it: the stream is broken."""

    def __init__(self, peer: int, tag: int, sent: int, posted: int):
        super().__init__(
            f"message truncated: rank {peer} sent {sent} bytes with tag {tag} where "
            f"{posted} were posted for it"
        )


class Inbound:
    """What one peer sends this rank: its ring, the message being read, the receives
    posted for it and the messages that came before their receive."""

    __slots__ = (
        "ring",
        "head",
        "cur",
        "cur_add",
        "cur_off",
        "cur_len",
        "cur_tag",
        "posted",
        "unexpected",
    )

    def __init__(self, ring: Ring):
        self.ring = ring
        self.head = int(ring.head[0])
        self.cur: np.ndarray | None = None  # where the message being read goes
        self.cur_add: np.ndarray | None = None  # or the elements it is added into
        self.cur_off = self.cur_len = self.cur_tag = 0
        self.posted: dict[int, deque] = {}  # tag -> receives not yet matched, in order
        self.unexpected: dict[int, deque] = {}  # tag -> messages nobody had asked for yet

    def post(self, op: Op) -> None:
        waiting = self.unexpected.get(op.tag)
        if waiting:
            deliver(op, waiting.popleft())
            return
        queue = self.posted.get(op.tag)
        if queue is None:  # not setdefault: that would make a deque on every post
            queue = self.posted[op.tag] = deque()
        queue.append(op)

    def withdraw(self, op: Op) -> bool:
        """Forget a posted receive; False if half its data was already added in."""
        queue = self.posted.get(op.tag)
        if queue is not None and op in queue:
            queue.remove(op)
        if self.cur is not op.buf:
            return True
        half_added = self.cur_add is not None
        self.cur, self.cur_add = op.buf.copy(), None  # being read: read it aside
        return not half_added

    def pull(self) -> bool:
        """Read what arrived into the receives it is for (or aside); whether any moved."""
        ring, head = self.ring, self.head
        avail = ring.tail[0] - head
        if avail <= 0:
            return False
        was, size = head, ring.size
        while avail > 0:
            if self.cur is None:
                if avail < 16:
                    break
                at = (head % size) >> 3
                tag, n = ring.words[at], ring.words[at + 1]
                head, avail = head + 16, avail - 16
                queue = self.posted.get(tag)  # the receive it is for: the first posted
                op = queue[0] if queue else None
                if op is not None and op.n != n:
                    raise Truncated(op.peer, tag, n, op.n)
                at = head % size
                if op is not None and avail >= op.end and at + n <= size:
                    # the common case: a posted receive's message, whole and not wrapped
                    take(op, ring.bytes[at : at + n], ring, head)
                    head, avail = head + op.end, avail - op.end
                    queue.popleft().done = True
                    continue
                self.cur_tag, self.cur_len, self.cur_off = tag, n, 0
                if op is None:
                    self.cur, self.cur_add = np.empty(n, np.uint8), None
                else:
                    self.cur, self.cur_add = op.buf, op.elems
            off, n = self.cur_off, self.cur_len
            chunk = min(pad(n) - off, avail)
            real = max(0, min(n - off, chunk))
            if real and self.cur_add is not None:
                item = self.cur_add.itemsize
                ring.add(head, self.cur_add[off // item : (off + real) // item])
            elif real:
                ring.get(head, memoryview(self.cur)[off : off + real])
            head, avail, self.cur_off = head + chunk, avail - chunk, off + chunk
            if self.cur_off < pad(n):
                break
            self._landed()
        self.head = head
        ring.head[0] = head
        return head != was

    def _landed(self) -> None:
        queue = self.posted.get(self.cur_tag)
        if queue and queue[0].buf is self.cur:
            queue.popleft().done = True
        elif queue:  # a receive was posted while the message was being read aside
            deliver(queue.popleft(), self.cur)
        else:  # nobody asked yet
            self.unexpected.setdefault(self.cur_tag, deque()).append(self.cur)
        self.cur = self.cur_add = None


def take(op: Op, src: memoryview, ring: Ring, pos: int) -> None:
    """Copy or add a whole message (``src``, at ring position ``pos``) into its receive."""
    if op.staged is not None:
        mem, staged = op.staged
        mem[:] = src
        np.add(op.elems, staged, out=op.elems)
    elif op.elems is not None:
        ring.add(pos, op.elems)
    else:
        op.mem[:] = src


def deliver(op: Op, message: np.ndarray) -> None:
    """Hand a message that was read aside to its receive."""
    if len(message) != len(op.buf):
        raise Truncated(op.peer, op.tag, len(message), len(op.buf))
    if op.elems is not None:
        np.add(op.elems, message.view(op.elems.dtype), out=op.elems)
    else:
        op.buf[:] = message
    op.done = True
