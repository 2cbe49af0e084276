"""The one-shot workspace's three rules, each shown necessary (commrt.transports.
cuda_ipc_direct): with it every call's sum is exact; without it, while one rank's stream
runs behind its host on the strict stand-in device, a rank sums a piece that is not yet
(or no longer) there. The rules: the wait on each peer's counter; the counter raised by
the stream once the copy ran, not by the host; two halves used by the round's parity.
And a peer that dies while the others wait on its counter is named."""

import json
import re

import pytest
from helpers.mp import gloo_ranks, killed_peer_said

# one worker runs the whole module under pytest-xdist: its tests share one started job
pytestmark = pytest.mark.xdist_group("test_cuda_ipc_workspace")

RULES = ["wait", "posted by the stream", "two halves"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("workspace")
    codes, outs = gloo_ranks(2, "ipc_count_worker.py", out, "order", timeout=300)
    assert codes == [0, 0], "\n---\n".join(outs)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.slow
def test_with_the_rule_every_sum_is_exact(reports, rule):
    assert all(r[f"{rule} kept"] is True for r in reports), reports


@pytest.mark.parametrize("rule", RULES)
def test_without_the_rule_a_rank_sums_the_wrong_piece(reports, rule):
    assert any(r[f"{rule} removed"] is False for r in reports), reports


def test_a_peer_killed_while_the_others_wait_on_its_counter_is_named(tmp_path):
    said = killed_peer_said(3, "ipc_count_worker.py", tmp_path, within_s=20)
    assert re.search(r"rank 2's process \(pid \d+\) is gone", said), said
    assert "one_shot" in said, said
