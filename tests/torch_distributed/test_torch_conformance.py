"""PyTorch's own distributed suite against the "commrt" backend (2 ranks).

The runner (tests/workers/td_conformance.py) forks each case's two ranks, so a
case costs about a second, not the 5-30 s of spawned ranks that import torch
again. commrt is added to the suite's "ddp", "subgroup" and "plugin" backend
features by the runner. The rendezvous is file:// (the suite's ``init_method=``).

* ``test_pytorch_distributed_suite_selection``: representative collective,
  point-to-point and DDP cases that gloo passes (quick, in every run).
* ``test_pytorch_distributed_suite_all_to_all_gated_as_for_mpi``: CPU
  all-to-all cases the suite reserves for MPI, run over commrt.
* ``test_pytorch_distributed_suite_against_gloo`` (slow): every case of the
  suite over gloo, then over commrt with the suite's backend gates opened as
  for gloo (COMMRT_CONFORMANCE_GATES=gloo: cases it reserves for named backends
  run too); every case gloo passes must pass over commrt, but the KNOWN_GAPS.
  The tallies are in docs/conformance.md.
"""

import json
import os
import subprocess
import sys

import pytest

#: the tests/ folder (the runner is tests/workers/td_conformance.py)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = [
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_max",
    "test_all_reduce_product",
    "test_reduce_sum",
    "test_broadcast",
    "test_broadcast_full_group",
    "test_all_gather",
    "test_all_gather_coalesced_simple",
    "test_gather",
    "test_scatter",
    "test_barrier",
    "test_send_recv_with_tag",
    "test_destroy_group",
    "test_DistributedDataParallelCPU",
    "test_ddp_create_graph",  # gradients that require grad reach the group
    "test_static_graph_api_cpu",
]

#: cases gloo passes that commrt does not, and why (docs/conformance.md)
KNOWN_GAPS = {
    # the test body sets its model up only for BACKEND mpi, gloo or nccl
    "test_accumulate_gradients_no_sync": "gloo-only test body",
    "test_accumulate_gradients_no_sync_allreduce_hook": "gloo-only test body",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "gloo-only test body",
    "test_accumulate_gradients_no_sync_grad_is_view": "gloo-only test body",
    # torch itself refuses monitored_barrier on any backend but gloo
    "test_monitored_barrier_gloo": "monitored_barrier: gloo only",
    "test_monitored_barrier_gloo_rank_0_timeout": "monitored_barrier: gloo only",
    "test_monitored_barrier_gloo_subgroup": "monitored_barrier: gloo only",
    # commrt's transports match (peer, tag): no receive from any source
    "test_send_recv_any_source": "recv without src",
    "test_send_recv_any_source_autograd_profiler": "recv without src",
    "test_send_recv_any_source_torch_profiler": "recv without src",
    "test_sparse_all_reduce_sum": "sparse tensors",
}


def _start(tmp_path, name, cases, exact, **env):
    """Start the runner over ``cases`` (all: none named) in a folder of its own; return the
    process and the folder (:func:`_finish` reads its report)."""
    root = tmp_path / name  # the suite's rendezvous files: apart from a run beside it
    scratch = root / "tmpdir"  # temporary files: none of ours may be left there
    scratch.mkdir(parents=True)
    env = dict(
        os.environ,
        COMMRT_ALGORITHM="ring",  # the suite checks semantics; auto's probe would add time
        OMP_NUM_THREADS="1",
        TEMP_DIR=str(root),
        TMPDIR=str(scratch),
        **env,
    )
    if exact:
        env["COMMRT_CONFORMANCE_EXACT"] = "1"
    cmd = [sys.executable, os.path.join(TESTS, "workers", "td_conformance.py")]
    with open(root / "output.txt", "w") as log:  # a file: a full pipe would stall the run
        proc = subprocess.Popen(
            [*cmd, str(root / "report.json"), *cases], env=env, stdout=log, stderr=log
        )
    return proc, root


def _finish(started) -> dict:
    proc, root = started
    try:
        proc.wait(timeout=1500)
    finally:
        proc.kill()  # nothing, once it ended
    out = root / "report.json"
    assert out.exists(), (root / "output.txt").read_text()[-6000:]
    # ours only: torch keeps its compile cache there (torchinductor_<user>), and some of
    # its suite's cases leave FileStore files (tmpXXXX) there, over gloo as over commrt
    left = [n for n in os.listdir(root / "tmpdir") if n.startswith("commrt-")]
    assert left == [], "the runner left temporary files behind"
    return json.loads(out.read_text())


def _suite(tmp_path, name, cases, exact, **env):
    return _finish(_start(tmp_path, name, cases, exact, **env))


@pytest.mark.slow
@pytest.mark.matrix  # PyTorch's own cases: the contract most likely to move between releases
def test_pytorch_distributed_suite_selection(tmp_path):
    report = _suite(tmp_path, "commrt", CASES, exact=True)
    assert report["failed"] == {}, json.dumps(report["failed"], indent=1)[:4000]
    assert report["run"] == len(CASES)
    assert sorted(report["passes"]) == sorted(CASES), report["skips"]


#: CPU all-to-all cases the suite gives MPI alone; commrt implements them (ops.all_to_all)
MPI_ONLY_CASES = [
    "test_all_to_all",
    "test_all_to_all_single_equal_split",
    "test_all_to_all_single_unequal_split",
]


def test_pytorch_distributed_suite_all_to_all_gated_as_for_mpi(tmp_path):
    report = _suite(tmp_path, "a2a", MPI_ONLY_CASES, exact=True, COMMRT_CONFORMANCE_GATES="mpi")
    assert report["failed"] == {}, json.dumps(report["failed"], indent=1)[:4000]
    assert sorted(report["passes"]) == sorted(MPI_ONLY_CASES), report["skips"]


@pytest.mark.slow
def test_pytorch_distributed_suite_against_gloo(tmp_path):
    # side by side: most of a run's minute is its cases' own waits, not CPU (57 s of wall
    # time for 23 s of CPU over gloo), so the two overlap instead of adding up
    runs = [
        _start(tmp_path, "gloo", [], exact=False, BACKEND="gloo"),
        _start(tmp_path, "commrt", [], exact=False, COMMRT_CONFORMANCE_GATES="gloo"),
    ]
    try:
        gloo, ours = [_finish(run) for run in runs]
    finally:
        for proc, _ in runs:  # a failed first one must not leave the second running
            proc.kill()
    # the runner found the suite: 285 cases on torch 2.13, 211 on 2.15 with Python 3.12
    assert gloo["run"] == ours["run"] > 200 and gloo["failed"] == {}
    missing = set(gloo["passes"]) - set(ours["passes"])
    assert missing == set(KNOWN_GAPS), {
        "unexpected": {c: ours["failed"].get(c, ours["skips"].get(c)) for c in missing},
        "now passing": sorted(set(KNOWN_GAPS) - missing),
    }
    # every known gap fails with a clear error or the test's own gate, never a hang
    assert set(ours["failed"]) <= set(KNOWN_GAPS), list(ours["failed"])
