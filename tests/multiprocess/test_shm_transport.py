"""The shared-memory transport across real processes: a dead peer, and ranks that cannot
share memory. Its results against MPI, gloo and float64 are in test_allreduce_mp.py; the
rings themselves in tests/unit/test_shm_rings.py."""

import json
import re

from helpers.mp import gloo_ranks, killed_peer_said


def test_a_killed_peer_is_named_and_the_job_ends_within_seconds(tmp_path):
    said = killed_peer_said(3, "shm_worker.py", tmp_path, within_s=15, timeout=120)
    assert re.search(r"shm failed in .*rank 2's process \(pid \d+\) is gone", said), said
    assert "it died" in said, said


def test_ranks_that_cannot_share_memory_all_refuse_or_all_fall_back_to_gloo(tmp_path):
    codes, outs = gloo_ranks(3, "shm_worker.py", "refuse", tmp_path, timeout=120)
    assert codes == [0, 0, 0], "\n---\n".join(outs)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    errors = {r["init_error"] for r in reports}
    assert len(errors) == 1, errors
    (error,) = errors
    assert "backend='shm'" in error and "rank 1: pretend: elsewhere" in error, error
    assert error.endswith("use gloo"), error
    assert [r["cpu_transport"] for r in reports] == ["gloo"] * 3
    assert [r["sum"] for r in reports] == [6.0] * 3
