"""bench/bench_hotpath_gpu.py's CPU-checkable parts: the ResNet-50 built from plain torch
layers where torchvision is missing has ResNet-50's parameter tensors, the tensor counts
the host-time cases name are the buckets' counts, and the two cuda_ipc ranks run on the
CPU stand-in device. The cases themselves need a CUDA GPU and have not run on one."""

from __future__ import annotations

import importlib
import os
from functools import partial

import pytest
import torch

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench")


@pytest.fixture
def H(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    return importlib.import_module("bench_hotpath_gpu")


def test_the_plain_resnet50_has_resnet50s_parameter_tensors_in_order(H):
    from bench_kernels import resnet50_shapes

    shapes = [tuple(p.shape) for p in H.plain_resnet50().parameters()]
    assert shapes == [tuple(s) for s in resnet50_shapes()]
    assert len(shapes) == 161 and sum(torch.Size(s).numel() for s in shapes) == 25_557_032
    out = H.plain_resnet50().eval()(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 1000)


def test_each_host_time_case_holds_the_tensor_count_it_names(H):
    from bench_kernels import bucket_shapes

    for count, (layout, mb) in H.COUNTS.items():
        assert len(bucket_shapes(layout, mb * H.MB)) == count, (count, layout, mb)


def _no_device():
    raise RuntimeError("no such device")


@pytest.mark.slow
def test_the_cuda_ipc_step_runs_two_ranks_and_names_a_rank_that_failed(H):
    """On the strict CPU stand-in for the GPU (tests/helpers/ipc_standin.py): the ranks
    meet, all-reduce and time; rank 0 reports. Its time says nothing of a GPU."""
    from helpers.ipc_standin import StandInDevice

    standin = partial(StandInDevice, latency_s=0.0)
    us, steps = H.run_ipc_ranks(H.ipc_rank, 10, make_device=standin)
    assert steps == 2 and us > 0
    with pytest.raises(RuntimeError, match="a cuda_ipc rank failed: .*no such device"):
        H.run_ipc_ranks(H.ipc_rank, 10, make_device=_no_device)


def test_the_cuda_ipc_bandwidth_ranks_time_each_size_and_the_copy(H):
    from helpers.ipc_standin import StandInDevice

    standin = partial(StandInDevice, latency_s=0.0)
    got = H.run_ipc_ranks(H.ipc_bandwidth_rank, {1: 2}, make_device=standin)
    assert list(got) == [1] and all(s > 0 for s in got[1]), got
