"""Keeping tensors alive while another stream still reads or writes them.

PyTorch's caching allocator ties a block to the stream it was allocated on.
A gradient made by backward (the caller's stream) and read on the
communication stream (a pack kernel, a copy into a bucket) can be freed by
the caller (``zero_grad(set_to_none=True)``, gossip's asynchronous swap, a
late backup rank dropping its gradient) while that read is still queued;
the allocator then hands the block to a new tensor and the read sees its
data. A Triton pointer table hides the tensors from the allocator
altogether (the kernel gets addresses, not tensors).

:func:`keep_alive` holds references to such tensors until the stream
passes an event recorded after their last use, then drops them: one event
per call rather than ``record_stream`` per tensor (which costs host time
per gradient). Only streams other than the default one need it; ``stream``
may be any object with ``record() -> event`` and ``event.query()`` (tests
use a fake one on CPU).

Example::

    >>> with torch.cuda.stream(comm_stream):                 # doctest: +SKIP
    ...     bucket.copy_(grad)
    ...     keep_alive([grad])        # grad lives until comm_stream passed the copy
"""

from __future__ import annotations

import threading
from collections import deque

import torch

_held: deque = deque()  # (event, tensors), oldest first
_lock = threading.Lock()


def _prune() -> None:
    while _held and _held[0][0].query():
        _held.popleft()


def held() -> int:
    """Tensor lists still held (tests, stats)."""
    with _lock:
        _prune()
        return len(_held)


def keep_alive(tensors, stream=None) -> None:
    """Hold ``tensors`` until ``stream`` (default: the current CUDA stream of their device,
    when it is not the default stream) has run what was enqueued so far."""
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return
    if stream is None:
        dev = tensors[0].device
        if dev.type != "cuda":
            return  # host work is synchronous: nothing to outlive
        stream = torch.cuda.current_stream(dev)
        if is_default(stream, dev):
            return  # the tensors' own stream: the allocator orders it already
        ev = stream.record_event()
    else:
        ev = stream.record()
    hold_until(ev, tensors)


#: CUDA device index -> the handle of its default stream
_DEFAULT_STREAM: dict = {}


def is_default(stream, device: torch.device) -> bool:
    """Whether ``stream`` is the default stream of CUDA ``device`` (an indexed device). The
    default stream's handle is asked for once per device: the query is a noticeable part
    of a kernel launch's host time."""
    handle = _DEFAULT_STREAM.get(device.index)
    if handle is None:
        handle = _DEFAULT_STREAM[device.index] = torch.cuda.default_stream(device).cuda_stream
    return stream.cuda_stream == handle


def hold_until(event, tensors) -> None:
    """Hold ``tensors`` until ``event.query()`` is true: :func:`keep_alive` for a caller
    that already knows its stream is not the default one and has recorded the event
    (the Triton launches, which look up the current stream once per call)."""
    with _lock:
        _prune()
        _held.append((event, list(tensors)))
