"""PyTorch's own distributed suite against the "commrt" backend (2 ranks).

A selection that fits the test budget (each case spawns its own two ranks,
about 10 s on an idle 2-core machine): collectives, point-to-point with
tags, a group of every rank and DDP on CPU, all of which gloo passes.
The fuller run (every collective and DDP case, then the rest) is
``python tests/workers/td_conformance.py report.json test_all_reduce
test_broadcast ... '*'``; its numbers are in docs/ARCHITECTURE.md's room for
commrt.distributed. commrt is added to the suite's "ddp", "subgroup" and
"plugin" backend features by the runner (tests/workers/td_conformance.py).
The rendezvous is file:// (the suite's ``init_method=``).
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = [
    "test_all_reduce_sum",
    "test_all_reduce_max",
    "test_broadcast",
    "test_broadcast_full_group",
    "test_all_gather",
    "test_barrier",
    "test_send_recv_with_tag",
    "test_DistributedDataParallelCPU",
]


def test_pytorch_distributed_suite_selection(tmp_path):
    out = tmp_path / "report.json"
    env = dict(
        os.environ,
        COMMRT_CONFORMANCE_EXACT="1",
        COMMRT_ALGORITHM="ring",  # the suite checks semantics; auto's probe would add time
        OMP_NUM_THREADS="1",
        TEMP_DIR=str(tmp_path),
    )
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "workers", "td_conformance.py"), str(out), *CASES],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failed"] == {}, json.dumps(report["failed"], indent=1)[:4000]
    assert report["run"] == len(CASES)
    assert sorted(report["passes"]) == sorted(CASES), report["skips"]
