"""Launch configurations for the Triton kernels: a fixed heuristic of the element count.

Pack, unpack and reduce are memory-bound element-wise kernels: any
configuration that keeps enough loads in flight reaches the memory's
bandwidth, and which one wins by a few percent depends on the GPU. Tuning
that at run time cost a group's first CUDA call some 20 s (every size class
times every configuration, per dtype), timed aligned tensors where the real
pieces start anywhere, and synchronised the device in the middle of a step.
So the configuration is a pure function of the size, chosen once here:

* large launches (at least :data:`LARGE_FROM` elements): blocks of 4096
  elements over 8 warps, 16 elements a thread, four 128-bit loads of fp32;
* smaller ones: blocks of 1024 over 4 warps, so that a launch of a few
  thousand elements still spreads over several programs.

Both blocks divide :data:`commrt.kernels._triton.MIN_CHUNK` (a pack or unpack
chunk is a whole number of blocks). Two configurations mean at most two
compilations per kernel, dtype and pointer alignment: the warm-ups
(:meth:`commrt.schedule.executor.Executor.warm`) compile them before a step.
"""

from __future__ import annotations

import dataclasses

__all__ = ["LaunchConfig", "SMALL", "LARGE", "LARGE_FROM", "CONFIGS", "launch_config"]


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchConfig:
    """``block`` elements per program step, over ``num_warps`` warps."""

    block: int
    num_warps: int


SMALL = LaunchConfig(block=1024, num_warps=4)
LARGE = LaunchConfig(block=4096, num_warps=8)
#: the element count from which a launch takes :data:`LARGE`
LARGE_FROM = 1 << 16
#: every configuration :func:`launch_config` returns
CONFIGS = (SMALL, LARGE)


def launch_config(numel: int) -> LaunchConfig:
    """The configuration of a launch over ``numel`` elements (the whole list's, for pack
    and unpack; the piece's, for reduce)."""
    return LARGE if numel >= LARGE_FROM else SMALL
