"""The one-shot workspaces' rules, each shown necessary: on the device
(commrt.transports.cuda_ipc_direct) the wait on each peer's counter, the counter raised
by the stream once the copy ran (not by the host), two halves used by the round's parity;
on the host (commrt.transports.cuda_ipc_host) the wait on each peer's counter, the host's
wait for its own copy out, two halves. With them every call's sum is exact; without one,
while one rank's stream runs behind its host on the strict stand-in device (and, on the
host path, its host sums late), a rank sums a piece that is not yet (or no longer) there.
And a peer that dies while the others wait on its counter is named."""

import json
import re

import pytest
from helpers.mp import gloo_ranks, killed_peer_said

# one worker runs the whole module under pytest-xdist: its tests share one started job
pytestmark = pytest.mark.xdist_group("test_cuda_ipc_workspace")

RULES = {
    "order": ["wait", "posted by the stream", "two halves"],
    "order_host": ["wait", "copy waited for", "two halves"],
}
CASES = [(mode, rule) for mode, rules in RULES.items() for rule in rules]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The reports of a mode's job (run once per module, at its first use)."""
    got = {}

    def run(mode):
        if mode not in got:
            out = tmp_path_factory.mktemp(mode)
            codes, outs = gloo_ranks(2, "ipc_count_worker.py", out, mode, timeout=300)
            assert codes == [0, 0], "\n---\n".join(outs)
            got[mode] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        return got[mode]

    return run


@pytest.mark.parametrize("mode,rule", CASES)
@pytest.mark.slow
def test_with_the_rule_every_sum_is_exact(ran, mode, rule):
    got = ran(mode)
    assert all(r[f"{rule} kept"] is True for r in got), got


@pytest.mark.parametrize(
    "mode,rule",
    # the quick loop runs one mode's job: the other is the same check on the host's path
    [pytest.param(*c, marks=[pytest.mark.slow] if c[0] == "order_host" else []) for c in CASES],
)
def test_without_the_rule_a_rank_sums_the_wrong_piece(ran, mode, rule):
    got = ran(mode)
    assert any(r[f"{rule} removed"] is False for r in got), got


def test_a_peer_killed_while_the_others_wait_on_its_counter_is_named(tmp_path):
    said = killed_peer_said(3, "ipc_count_worker.py", tmp_path, within_s=20)
    assert re.search(r"rank 2's process \(pid \d+\) is gone", said), said
    assert "one_shot" in said, said
