"""bench/conftest.py under several ranks: only rank 0 reports, in the terminal and in files.

Each rank here is a plain pytest process told its rank by RANK (as torchrun
tells it), running one single-process case of the kernel benchmark, so
nothing needs to line up between them.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE = "cpu-1MB-resnet50-copy"


def _bench_as(rank: int, out) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "bench/bench_kernels.py", "-k", CASE, "-q"]
    cmd += ["-p", "no:cacheprovider", "--benchmark-only", "--benchmark-json", str(out)]
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
    for name in [n for n in env if n.startswith("PYTEST_XDIST_")]:
        del env[name]  # the child is a pytest session of its own, not an xdist worker
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_only_rank_0_writes_the_json_report(tmp_path):
    out = tmp_path / "report.json"
    # a rank other than 0 writes nothing and prints nothing (pytest-benchmark before 5.3
    # opens the file when it parses the option, so an empty file may be left)
    other = _bench_as(1, out)
    assert other.returncode == 0, other.stdout[-2000:] + other.stderr[-2000:]
    assert not out.exists() or out.read_text() == ""
    assert other.stdout == ""
    first = _bench_as(0, out)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [b["name"] for b in report["benchmarks"]] == [f"test_kernel_throughput[{CASE}]"]
