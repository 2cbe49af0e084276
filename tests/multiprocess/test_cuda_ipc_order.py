"""The four waits that order ``cuda_ipc``'s copies, each shown necessary: with it the
messages arrive intact, without it (under stream latencies that let the race happen on
the strict stand-in device, whose streams run later than the host issues) they do not.
See the module docs of commrt.transports.cuda_ipc for the protocol."""

import json

import pytest
from helpers.mp import gloo_ranks

# one worker runs the whole module under pytest-xdist: its tests share one started job
# (a module fixture)
pytestmark = pytest.mark.xdist_group("test_cuda_ipc_order")

WAITS = ["wait_ready", "can_write", "wait_consumed", "can_read"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("order")
    codes, outs = gloo_ranks(2, "ipc_worker.py", "order", out, timeout=300)
    assert codes == [0, 0], "\n---\n".join(outs)
    return json.loads((out / "rank1.json").read_text())  # the receiver's view


@pytest.mark.parametrize("wait", WAITS)
@pytest.mark.slow
def test_with_the_wait_every_message_arrives_intact(report, wait):
    assert report[f"{wait} kept"] is True, report


@pytest.mark.parametrize("wait", WAITS)
def test_without_the_wait_the_data_is_wrong_or_the_error_named(report, wait):
    got = report[f"{wait} removed"]
    assert got is False or "message truncated" in str(got), report
