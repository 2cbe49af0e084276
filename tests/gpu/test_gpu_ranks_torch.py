"""Several ranks on ONE GPU over ``cuda_ipc``: DDP and FSDP2 on backend "commrt" with CUDA
tensors (``cuda:commrt``), two ranks. The group takes cuda_ipc because the ranks share
a GPU; both against float64.
How they run: helpers.gpu.gpu_ranks. Skipped where there is no CUDA GPU: tools/gpu_check.py
then reports them as not run.
"""

from helpers.gpu import GPU_ONLY, gpu_ranks

pytestmark = GPU_ONLY


def test_ddp_and_fsdp2_on_cuda_commrt_at_two_ranks_on_one_gpu(tmp_path):
    for report in gpu_ranks(tmp_path, 2, "ddp"):
        assert report.pop("cuda transport") == "cuda_ipc", report
        for case, err in report.items():
            assert err < 1e-5, (case, err)
