"""Timing on a CUDA GPU that measures the kernel, not the host or the L2 cache.

Used by ``bench_kernels.py`` and ``bench_hotpath_gpu.py``. Two figures, taken
apart:

* **GPU time per call** (:func:`gpu_seconds`): the calls of a round rotate
  through buffer sets that together exceed the L2 cache several times over
  (:func:`buffer_sets`), so each launch reads data that no recent launch
  left in the cache. The round is queued behind a ``torch.cuda._sleep`` long
  enough for the host to enqueue every call before the GPU reaches them, and
  two CUDA events around the calls time the GPU running them back to back.
  If the GPU reached the first event before the host had enqueued the last
  call (it caught up: the sleep was too short), the round runs again with a
  longer sleep.
* **Host time per call** (:func:`host_seconds`): ``time.perf_counter``
  around the calls alone, while the GPU is still busy with a sleep queued
  before them, so no call waits for the GPU and no synchronisation is
  counted.

The pure parts (how many sets, how many calls a round, how long a sleep,
GB/s) take numbers and are tested on the CPU; the timing itself needs a GPU
and has not run on one yet.
"""

from __future__ import annotations

import functools
import math
import time

import torch

#: the buffer sets of one op together hold at least this many times the L2 cache
L2_TIMES = 4
#: the buffer sets of one op may take at most this share of the GPU's free memory
#: (an op's sets and its copy_'s sets are alive together: 2 x 0.4 leaves a fifth free)
FREE_SHARE = 0.4
#: a round moves about this many bytes, in at least one call per set and at most
#: MAX_CALLS calls (the launch queue holds about a thousand)
ROUND_BYTES, MAX_CALLS = 4e9, 256
#: the sleep covers this many times the host's measured time for the round's calls
SLEEP_MARGIN = 1.5
#: a round whose GPU caught up with the host runs again, with a sleep this many times
#: longer, at most this many times
SLEEP_GROWTH, SLEEP_TRIES = 2, 4
#: the first guess of the host's time per call, before it is measured (pack of a
#: thousand tensors took about this much before the launch path was cut)
HOST_GUESS_S = 1e-3


def buffer_sets(
    l2_bytes: int, set_bytes: int, free_bytes: int, times: int = L2_TIMES, share=FREE_SHARE
) -> int:
    """How many buffer sets of ``set_bytes`` (an op's inputs and outputs) to rotate
    through: enough that together they hold ``times`` × ``l2_bytes``, so a set's data is
    evicted before the set comes round again; no more than ``share`` of ``free_bytes``
    holds; at least one (a set larger than the cache evicts itself)."""
    if set_bytes <= 0:
        raise ValueError(f"a buffer set must hold something, not {set_bytes} bytes")
    want = max(1, math.ceil(times * l2_bytes / set_bytes))
    room = max(1, int(share * free_bytes) // set_bytes)
    return min(want, room)


def calls_per_round(sets: int, set_bytes: int) -> int:
    """Calls in one GPU round: about :data:`ROUND_BYTES` moved (a round of a few ms times
    well with events), at most :data:`MAX_CALLS`, in whole passes over the ``sets`` (each
    set used as often): at least one pass, however many sets."""
    want = max(1, min(MAX_CALLS, int(ROUND_BYTES // max(1, set_bytes))))
    return max(1, want // sets) * sets


def sleep_cycles(host_s: float, cycles_per_s: float, margin: float = SLEEP_MARGIN) -> int:
    """GPU clock cycles of ``torch.cuda._sleep`` that outlast ``host_s`` of host work
    ``margin`` times over."""
    if host_s < 0 or cycles_per_s <= 0:
        raise ValueError(f"host time {host_s} s and clock {cycles_per_s} cycles/s")
    return max(1000, int(margin * host_s * cycles_per_s))


def gbps(nbytes: float, seconds: float) -> float:
    """GB/s (1e9 bytes a second) of ``nbytes`` moved in ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"a time must be positive, not {seconds} s")
    return nbytes / seconds / 1e9


def l2_and_free_bytes(device=None) -> tuple[int, int]:
    """(L2 cache size, free memory) of the GPU, in bytes."""
    dev = torch.device(device or "cuda")
    free, _ = torch.cuda.mem_get_info(dev)
    return torch.cuda.get_device_properties(dev).L2_cache_size, free


@functools.lru_cache(maxsize=1)
def cycles_per_second() -> float:
    """The rate ``torch.cuda._sleep`` counts cycles at, timed once with CUDA events."""
    cycles = 1 << 24
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def busy_round(fns, calls: int, cycles: int) -> tuple[float, float, bool]:
    """``calls`` calls, rotating through ``fns``, queued behind a sleep of ``cycles``:
    (GPU seconds per call between two events, host seconds per call around the calls,
    whether the GPU caught up with the host before the last call was enqueued)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    t0 = time.perf_counter()
    for i in range(calls):
        fns[i % len(fns)]()
    host = time.perf_counter() - t0
    caught_up = start.query()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls, host / calls, caught_up


def host_seconds(fn, calls: int = 20, guess_s: float = HOST_GUESS_S) -> float:
    """Host seconds per call of ``fn`` with the GPU kept busy (see the module docs)."""
    rate, per_call = cycles_per_second(), guess_s
    for _ in range(SLEEP_TRIES):
        _, per_call, caught_up = busy_round([fn], calls, sleep_cycles(per_call * calls, rate))
        if not caught_up:
            break
    return per_call


def gpu_seconds(fns, calls: int, host_s: float) -> tuple[float, bool]:
    """(GPU seconds per call of ``calls`` calls rotating through ``fns``, whether the GPU
    still caught up with the host after every longer sleep: then the figure is the
    host's pace). ``host_s`` is the host's time per call, measured before."""
    cycles = sleep_cycles(host_s * calls, cycles_per_second())
    for _ in range(SLEEP_TRIES):
        gpu, _, caught_up = busy_round(fns, calls, cycles)
        if not caught_up:
            return gpu, False
        cycles *= SLEEP_GROWTH
    return gpu, True
