"""A replacement rejoins gossip with a deadline (commrt.sync.gossip.rejoin).

4 real gloo ranks run tests/workers/gossip_rejoin_worker.py; rank 1 SIGKILLs
itself, the test starts a replacement with RANK=1 and COMMRT_REJOIN=1. It
takes its state and step from a survivor, every survivor admits it within
one period of its return, and from then on every message between it and a
survivor is matched on both ends: whenever one sends to the other at a
step, the other receives from it at that step."""

import json
import os
import sys
import time

import pytest
from helpers.mp import TESTS, GlooJob

sys.path.insert(0, os.path.join(TESTS, "workers"))
import gossip_rejoin_worker as W  # noqa: E402

from commrt.algorithms import Gossip  # noqa: E402

N = 4
PERIOD = Gossip(topology="hypercube").period_length(N)


def _wait_exit(proc, timeout: float):
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.poll()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.slow
def test_a_replacement_is_in_the_rotation_within_one_period(tmp_path, mode):
    job = GlooJob("gossip_rejoin_worker.py", (tmp_path, mode), N)
    for r in range(N):
        job.start(r)
    assert _wait_exit(job.procs[1], 300) == -9, job.procs[1].communicate()[0][-3000:]
    job.start(1, COMMRT_REJOIN="1")
    codes, outs = job.finish(400)
    assert codes == [0, -9, 0, 0, 0], "\n".join(o[-3000:] for o in outs)
    assert all("Traceback" not in o for o in outs), "\n".join(o[-3000:] for o in outs)

    def load(name):
        return json.loads((tmp_path / f"{name}.json").read_text())

    new = load("rank1.replacement")
    survivors = {r: load(f"rank{r}") for r in (0, 2, 3)}
    start = min(int(t) for t in new["peers"])
    assert start > W.KILL_AT and start % PERIOD == 0, start
    assert new["state_after_first"], "the optimizer state did not come with the snapshot"
    assert new["finite"] and all(s["finite"] for s in survivors.values())
    for r, s in survivors.items():
        admitted = s["admitted_from"]["1"]
        # read at its next period boundary, from the start of the replacement's steps on
        assert start <= admitted <= s["seen_back"] + PERIOD, (r, admitted, s["seen_back"])
        assert new["admitted_from"][str(r)] == admitted, (r, new["admitted_from"])
    # every message between the replacement and a survivor is matched on both ends
    exchanged = 0
    for t, (send, recv) in new["peers"].items():
        for peer, other_end in ((send, 1), (recv, 0)):
            if peer == 1:
                continue
            assert survivors[peer]["peers"][t][other_end] == 1, (t, peer, survivors[peer])
            exchanged += 1
    for r, s in survivors.items():
        for t, (send, recv) in s["peers"].items():
            if int(t) >= start and 1 in (send, recv):
                assert t in new["peers"], (r, t)
    assert exchanged > 0
    first = min(int(t) for t, (send, recv) in new["peers"].items() if (send, recv) != (1, 1))
    assert first < start + PERIOD, (first, start)
    led = new["ledger"]
    assert led["lost"] == 0 and led["lost_sends"] == 0 and led["received"] > 0, led
    assert led["sent"] > 0, led
