"""AVG follows one rule on every path: 1/p is applied to each input before the sum
(commrt.transports.base.average_factor). Four ranks each hold a value whose sum overflows
fp16 (or bf16) but whose average is the value itself: every path gives the value back,
where dividing after the sum gives inf. And no path spells the rule out for itself."""

import json
import re

import pytest
from helpers.layout import library_sources
from helpers.mp import gloo_ranks, mpiexec

PATHS = ("all_reduce", "reduce_scatter", "native", "hook", "hook wire", "GradientSync")


def _reports(tmp_path, n):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        "shm",
        pytest.param("cuda_ipc", marks=pytest.mark.slow),
        pytest.param("mpi", marks=[pytest.mark.mpi, pytest.mark.slow]),
    ],
)
def test_every_average_path_scales_before_the_sum_in_fp16_and_bf16(tmp_path, backend):
    if backend == "mpi":
        proc = mpiexec(4, "average_worker.py", backend, tmp_path, timeout=240, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        codes, outs = gloo_ranks(4, "average_worker.py", backend, tmp_path, timeout=240)
        assert codes == [0] * 4, "\n---\n".join(o[-3000:] for o in outs)
    for report in _reports(tmp_path, 4):
        expected = {f"{p} {d}" for p in PATHS for d in ("float16", "bfloat16")}
        if backend == "mpi":
            expected.discard("native bfloat16")  # MPI has no bfloat16 reduction
        assert set(report) == expected, report
        assert all(v == 1.0 for v in report.values()), report  # the value, not inf


#: an average spelled out: a division by the world size after a sum, or its reciprocal
SPELLED = re.compile(
    r"div_\(\s*(p|world_size|\w+\.world_size)\s*\)|1(\.0)? / (p|world_size|\w+\.world_size)\b"
)


def test_no_path_spells_the_average_out_for_itself():
    found = [
        f"{name}: {line.strip()}"
        for name, path in library_sources()
        if name != "commrt.transports.base"
        for line in path.read_text().splitlines()
        if SPELLED.search(line) and "``" not in line and not line.lstrip().startswith("#")
    ]
    assert not found, found
