"""Several ranks on ONE GPU over ``cuda_ipc``: GradientSync at 2 and 4 ranks. Ring, torus2d
and gossip with fp32 and a bf16 wire (against float64, or across ranks after averaging),
bucket 0's communication during backward in the trace; gossip with a deadline and
backup workers (every rank ends with the same parameters).
How they run: helpers.gpu.gpu_ranks. Skipped where there is no CUDA GPU: tools/gpu_check.py
then reports them as not run.
"""

import pytest
from helpers.gpu import GPU_ONLY, check_deadline, check_gradsync, gpu_ranks

pytestmark = GPU_ONLY


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def gradsync(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"gradsync{request.param}")
    return gpu_ranks(out, request.param, "gradsync")


def test_gradient_sync_ring_torus2d_gossip_fp32_bf16_with_overlap(gradsync):
    for report in gradsync:
        assert report["ran on"] == "cuda_ipc cuda", report
        check_gradsync(report)


def test_gradient_sync_gossip_with_a_deadline(gradsync):
    """Its ranks late in turn: late messages applied later, every gradient accounted."""
    for report in gradsync:
        check_deadline(report)


def test_gradient_sync_backup_workers(gradsync):
    for report in gradsync:
        got = report["backup float32"]
        assert isinstance(got, dict) and got["vs rank 0"] == 0.0, got
