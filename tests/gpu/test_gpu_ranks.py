"""Several ranks on ONE GPU over ``cuda_ipc``: collectives at 2 and 4 ranks (all_reduce
with ring, halving-doubling, torus2d, one-shot and two-shot, reduce_scatter, all_gather, against float64),
and the stall verdict for a rank stuck in user code.
How they run: helpers.gpu.gpu_ranks. Skipped where there is no CUDA GPU: tools/gpu_check.py
then reports them as not run.
"""

import pytest
from helpers.gpu import GPU_ONLY, NO_INTERPRETER, RANKS_LIMIT_S, gpu_ranks
from helpers.mp import gloo_ranks

pytestmark = GPU_ONLY


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_on_one_gpu_over_cuda_ipc(tmp_path, n):
    for report in gpu_ranks(tmp_path, n, "collectives"):
        assert report.pop("ran on") == "cuda_ipc cuda", report
        for case, err in report.items():
            assert err < (1e-5 if "float32" in case else 1e-12), (case, err)


def test_stall_verdict_names_a_gpu_rank_stuck_in_user_code(tmp_path):
    codes, outs = gloo_ranks(4, "verdict_worker.py", "user", "cuda_ipc", timeout=RANKS_LIMIT_S,
                             env={"COMMRT_STALL_S": "10", "COMMRT_DUMP": str(tmp_path)},
                             drop_env=NO_INTERPRETER)  # fmt: skip
    said = "\n".join(outs)
    assert codes == [1, 1, 1, 1], said
    assert "commrt stall verdict (the same on every rank):" in said, said
    assert "rank 3 " in said and "IN USER CODE" in said, said
