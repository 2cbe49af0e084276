"""The kernels' launch configuration is a fixed heuristic of the size, not autotuning.

:func:`commrt.kernels.configs.launch_config` is a pure function: these tests pin what
it returns, that every configuration fits the pack and unpack chunks, and that a GPU
launch of reduce_ and pack (the kernels replaced by stand-ins that record their launch)
takes the configuration of its size, with the grid that configuration implies.
"""

from __future__ import annotations

import pytest
import torch

from commrt.kernels import _triton as K
from commrt.kernels.configs import CONFIGS, LARGE, LARGE_FROM, SMALL, launch_config


@pytest.mark.parametrize(
    "numel, want",
    [(1, SMALL), (1000, SMALL), (LARGE_FROM - 1, SMALL), (LARGE_FROM, LARGE), (1 << 30, LARGE)],
)
def test_the_configuration_is_a_function_of_the_size(numel, want):
    assert launch_config(numel) == want
    assert launch_config(numel) is launch_config(numel)  # no state: the same answer each time


def test_every_configuration_fits_a_chunk_and_there_are_few():
    assert {launch_config(1 << k) for k in range(40)} == set(CONFIGS)
    for cfg in CONFIGS:
        assert K.MIN_CHUNK % cfg.block == 0  # a pack/unpack chunk is whole blocks
        assert cfg.block & (cfg.block - 1) == 0 and cfg.num_warps in (1, 2, 4, 8, 16)
    assert len(CONFIGS) <= 2  # compilations per kernel, dtype and alignment


class _Recorder:
    """A kernel stand-in: ``kernel[grid](*args, **kwargs)`` records the launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, kwargs))


@pytest.fixture
def on_gpu_path(monkeypatch):
    """The compiled-kernel launch path, on CPU tensors, with recording stand-in kernels."""
    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    monkeypatch.setattr(K, "_chunk_for", lambda total, device: K.MIN_CHUNK)
    kernels = {name: _Recorder() for name in ("_reduce_kernel", "_pack_kernel")}
    for name, rec in kernels.items():
        monkeypatch.setattr(K, name, rec)
    return kernels


@pytest.mark.parametrize("n", [5, LARGE_FROM + 3])
def test_reduce_launches_with_its_sizes_configuration(on_gpu_path, n):
    dst, src = torch.zeros(n), torch.zeros(n)
    K.reduce_(dst, src, 1.0, 1.0)
    cfg = launch_config(n)
    [(grid, kwargs)] = on_gpu_path["_reduce_kernel"].launches
    assert grid == (-(-n // cfg.block),)
    assert kwargs["BLOCK"] == cfg.block and kwargs["num_warps"] == cfg.num_warps
    assert kwargs["enable_fp_fusion"] is False


def test_pack_launches_with_the_whole_lists_configuration(on_gpu_path):
    tensors = [torch.ones(LARGE_FROM // 2), torch.ones(LARGE_FROM // 2 + 1)]
    out = torch.empty(sum(t.numel() for t in tensors))
    K.pack(tensors, tuple(t.numel() for t in tensors), out, 1.0, out.numel())
    [(grid, kwargs)] = on_gpu_path["_pack_kernel"].launches
    assert kwargs["BLOCK"] == LARGE.block and kwargs["num_warps"] == LARGE.num_warps
    assert grid == (
        -(-(LARGE_FROM // 2) // K.MIN_CHUNK) + -(-(LARGE_FROM // 2 + 1) // K.MIN_CHUNK),
    )
