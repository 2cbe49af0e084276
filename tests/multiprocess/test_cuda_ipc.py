"""The ``cuda_ipc`` transport across real processes, on the strict CPU stand-in device
(tests/helpers/ipc_standin.py): collectives against float64, messages in issue order,
a size mismatch, a dead peer, a timeout, and ranks that cannot reach each other. The
ordering of its waits is in test_cuda_ipc_order.py. None of this is a GPU result."""

import json
import re

import pytest
from helpers.gpu import check_deadline, check_gradsync
from helpers.mp import gloo_ranks, killed_peer_said


def _reports(tmp_path, n):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.slow
def test_collectives_match_float64_at_2_and_4_ranks(tmp_path, n):
    codes, outs = gloo_ranks(n, "ipc_worker.py", "collectives", tmp_path, timeout=400)
    assert codes == [0] * n, "\n---\n".join(outs)
    for report in _reports(tmp_path, n):
        assert report.pop("ran on") == "cuda_ipc cpu", report  # the stand-in: never a GPU
        assert len(report) == 2 * 3 * 7, report  # dtypes x sizes x (5 all-reduces, rs, ag)
        for case, err in report.items():
            assert err < (1e-5 if "float32" in case else 1e-12), (case, err)


@pytest.mark.slow
def test_gradient_sync_runs_on_the_stand_in_as_the_gpu_check_runs_it(tmp_path):
    """tests/gpu/test_gpu_ranks.py's GradientSync worker, here on CPU tensors: ring,
    torus2d and gossip, fp32 and a bf16 wire, agree across ranks and with float64 (ring,
    torus2d), and bucket 0's communication overlaps backward; backup workers end with
    every rank's parameters alike; gossip with a deadline, its ranks late in turn, applies
    its late messages later and accounts for every gradient."""
    codes, outs = gloo_ranks(2, "ipc_worker.py", "gradsync", tmp_path, timeout=400)
    assert codes == [0, 0], "\n---\n".join(outs)
    for report in _reports(tmp_path, 2):
        assert report["ran on"] == "cuda_ipc cpu", report  # the stand-in: never a GPU
        check_gradsync(report)
        check_deadline(report)
        # the late rank's snapshot is longer than the slots: the server moves it along
        assert report["backup float32"] == {"vs rank 0": 0.0}, report


def test_messages_arrive_in_issue_order_through_reused_slots(tmp_path):
    codes, outs = gloo_ranks(2, "ipc_worker.py", "sequence", tmp_path, timeout=200)
    assert codes == [0, 0], "\n---\n".join(outs)
    for report in _reports(tmp_path, 2):
        assert report.pop("pieces") == [198, 198], report  # 66 pieces a round, 3 rounds
        assert all(report.values()), report


def test_a_receive_of_another_size_is_a_named_error(tmp_path):
    codes, outs = gloo_ranks(2, "ipc_worker.py", "mismatch", tmp_path, timeout=120)
    assert codes == [0, 0], "\n---\n".join(outs)
    error = _reports(tmp_path, 2)[1]["error"]
    assert "rank 0 sent 400 bytes where 800 were posted" in error, error


def test_a_killed_peer_is_named_and_the_job_ends_within_seconds(tmp_path):
    said = killed_peer_said(3, "ipc_worker.py", tmp_path, within_s=20)
    assert re.search(r"cuda_ipc failed in .*rank 2's process \(pid \d+\) is gone", said), said


@pytest.mark.slow
def test_a_timeout_is_named_and_leaves_the_transport_unusable(tmp_path):
    codes, outs = gloo_ranks(2, "ipc_worker.py", "timeout", tmp_path, timeout=120)
    assert codes == [0, 0], "\n---\n".join(outs)
    report = _reports(tmp_path, 2)[0]
    assert report["first"].startswith("CommTimeoutError"), report
    assert report["first_s"] < 15, report
    assert "cuda_ipc transport is unusable" in report["second"], report


def test_devices_without_peer_access_are_refused_on_every_rank_alike(tmp_path):
    codes, outs = gloo_ranks(3, "ipc_worker.py", "refuse", tmp_path, timeout=120)
    assert codes == [0, 0, 0], "\n---\n".join(outs)
    errors = {r["init_error"] for r in _reports(tmp_path, 3)}
    assert len(errors) == 1, errors
    (error,) = errors
    assert "rank 0: standin" in error and "has no peer access to rank 1's" in error, error


@pytest.mark.slow
def test_a_close_waits_for_the_peers_streams_before_it_frees(tmp_path):
    """A peer's stream may still copy into this rank's slab or wait on its events until
    the peer has closed too: rank 0's close waits for rank 1's (1.5 s late), then frees;
    past the bound, with rank 1 alive and not closing, it frees nothing."""
    codes, outs = gloo_ranks(2, "ipc_worker.py", "close_waits", tmp_path, timeout=120)
    assert codes == [0, 0], "\n---\n".join(outs)
    first = _reports(tmp_path, 2)[0]
    assert first["close_s"] > 1.0 and first["freed"], first
    codes, outs = gloo_ranks(2, "ipc_worker.py", "close_leaves", tmp_path, timeout=120)
    assert codes == [0, 0], "\n---\n".join(outs)
    first = _reports(tmp_path, 2)[0]
    assert 0.9 < first["close_s"] < 3.5 and not first["freed"], first
