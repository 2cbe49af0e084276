"""The NCCL adapter and every algorithm family over the strict NCCL stand-in.

tests/helpers/nccl_strict.py models the NCCL rules that hang or corrupt memory on a
GPU: a new pair's connection blocks inside ``groupEnd`` until the peer's
matching group, counts and dtypes must match, group depth is per thread,
completion is asynchronous on a stream seen through events, ``destroy``
waits for pending work. Ranks are separate processes (gloo_ranks: torchrun's
variables, the store hosted by this test process), bytes go through the
store. What passes here verifies commrt's adapter and protocols against
those rules; it is not a GPU result.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest
import torch
from helpers.mp import TESTS, gloo_ranks

sys.path.insert(0, os.path.join(TESTS, "workers"))
import backup_worker as BW  # noqa: E402
import strict_worker as SW  # noqa: E402
from helpers import backup as TB  # noqa: E402
from helpers.nccl_strict import HostStream, NcclAborted, StandInHang, StrictNccl  # noqa: E402


def run(n, scenario, out, timeout=240):
    codes, outs = gloo_ranks(n, "strict_worker.py", scenario, out, timeout=timeout)
    assert codes == [0] * n, TB.failures(codes, outs)
    return [json.loads((out / f"{scenario}_rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.slow
def test_every_all_reduce_and_gossip_family_passes_its_oracle_on_four_ranks(tmp_path):
    for rec in run(4, "families", tmp_path):
        assert rec["cases"] == 3 * len(SW.SIZES) * 2 * 2 and rec["failures"] == [], rec
        assert rec["sync"] == {"ring": [True] * 3, "torus 2x2": [True] * 3}, rec["sync"]
        for alg, got in rec["gossip"].items():
            steps = got["steps"]
            assert all(good for _, good in steps), (alg, steps)
            assert [a for a, _ in steps] == ([0] + [1] * 5 if "async" in alg else [1] * 6)


def test_a_count_mismatch_is_a_named_error_on_both_sides(tmp_path):
    for rec in run(2, "mismatch", tmp_path, timeout=120):
        assert "rank 0 sends 4 x float32 to rank 1, which receives 8 x float32" in rec["error"]
        assert rec["error"].startswith("CommError") and rec["broken"], rec
        assert rec["elapsed"] < 5, rec  # at once, not after the 60 s timeout


@pytest.mark.slow
def test_backup_catch_up_between_ranks_that_never_connected(tmp_path):
    """The late rank and its server never exchanged (the ring ran over ranks 0 and 1 only).
    Before the fix the late rank marked its receive posted only after its groupEnd, which
    waits for the server's send, which waits for the mark: a deadlock the watchdog ended
    with 'NCCL connection setup in groupEnd' after the 5 s timeout."""
    recs = run(3, "catchup", tmp_path, timeout=120)
    for rec in recs:
        assert rec["error"] is None, rec
    server, late = recs[0], recs[2]
    assert server["served"] == 1 and late["got_step"] == 1
    assert late["params"] == server["params"] and late["momentum"] == server["momentum"]
    assert late["params"] != recs[1]["params"]  # the check can fail: rank 1 differs


@pytest.mark.parametrize("scenario", ["slowserve", "slowserve-stream"])
@pytest.mark.slow
def test_a_catch_up_server_that_sends_late_does_not_abort_the_receive(tmp_path, scenario):
    """The server starts its send 1 s after answering (it looks at its requests after its
    optimizer step and while it waits for arrivals); the two had connected before, so the
    late rank's groupEnd returns at once. It used to wait in 0.25 s slices, and an NCCL
    wait that passes its deadline aborts the communicator: the first slice aborted it
    ('aborted while waiting for message ... from rank 1'). ``-stream``: groups complete
    as on a CUDA stream, the late rank's wait is its host wait for the stream."""
    recs = run(3, scenario, tmp_path, timeout=120)
    for rec in recs:
        assert rec["error"] is None and rec["broken"] is None, rec
    server, late = recs[1], recs[2]
    assert server["served"] == 1 and late["got_step"] == 1
    assert late["params"] == server["params"] and late["momentum"] == server["momentum"]
    assert late["elapsed"] >= 1.0, late  # it did wait for the late send


@pytest.mark.parametrize("scenario", ["serverdies", "diesinwait", "diesinwait-stream"])
@pytest.mark.slow
def test_a_catch_up_server_that_dies_costs_the_late_rank_a_named_error_at_once(tmp_path, scenario):
    """The server answers, the late rank posts its receive, then the server is recorded dead
    and killed: the late rank waits in groupEnd (the two never connected, and it must not
    wait there for the 20 s timeout) or in the receive's wait. NCCL cannot cancel the receive,
    so the late rank cannot ask again (gloo does): it aborts its communicator and raises
    a CommError naming the death as soon as it is recorded, not the raw abort of a wait
    and not at the timeout; close() then does not wait for the stuck receive.
    ``-stream``: groups complete as on a CUDA stream, where the receive's wait returns at
    once and the real wait is the host's wait for the stream, which must be watched too,
    not left on the caller's thread for the whole 20 s timeout (NCCL does not report a peer
    killed within a node, NVIDIA/nccl#585)."""
    codes, outs = gloo_ranks(3, "strict_worker.py", scenario, tmp_path, timeout=120)
    assert codes == [0, -9, 0], TB.failures(codes, outs)
    late = json.loads((tmp_path / f"{scenario}_rank2.json").read_text())
    assert late["error"].startswith("CommError") and "got_step" not in late, late
    assert "catch-up server rank 1 was recorded dead" in late["error"], late
    assert "communicator was aborted" in late["error"] and late["broken"], late
    assert late["elapsed"] < 5 and late["close_s"] < 2, late


@pytest.mark.slow
def test_the_stand_in_catches_a_mark_written_after_groupend(tmp_path):
    """The catch-up deadlock in its smallest form, kept as a check on the stand-in itself:
    marking the receive posted after its groupEnd, for a pair that never connected, blocks
    until the watchdog (3 s) names it; marking first, the same transfer completes."""
    codes, outs = gloo_ranks(2, "strict_worker.py", "handshake", tmp_path, timeout=120)
    assert codes == [0, 0], TB.failures(codes, outs)
    server, late = (json.loads((tmp_path / f"handshake_rank{r}.json").read_text()) for r in (0, 1))
    assert "connection setup in groupEnd (peers [0])" in late["after"]["error"], late
    assert not server["after"]["saw_mark"], server
    assert late["first"] == {**late["first"], "error": None, "received": True}, late
    assert server["first"]["error"] is None and server["first"]["saw_mark"], server


@pytest.mark.slow
def test_backup_workers_with_catch_up_end_identical_and_exact(tmp_path):
    """test_backup's oracle (identical parameters and optimizer state, every update the
    on-time average) over the strict stand-in: the stream-ordered catch-up path."""
    codes, outs = gloo_ranks(4, "backup_worker.py", "nccl-strict", "random", tmp_path, timeout=240)
    assert codes == [0] * 4, TB.failures(codes, outs)
    recs, states = TB.load(tmp_path, "random")
    TB.assert_identical(states)
    final = recs[0]["final"]
    for r in recs:
        assert "error" not in r, r
        # every update applied once: by step() or, for a rank a step behind where the others
        # ended, by close()'s catch-up (sync/backup/ending.py), so the report's count is exact
        # and step()'s may be lower (seen once in CI: 12 of 13, states identical)
        updates = r["updates"][str(r["rank"])]
        assert r["global_step"] == final == updates >= sum(r["applied"]), r
    parts = TB.participants_by_step(recs)
    assert sorted(parts) == list(range(final)) and all(len(v) == 3 for v in parts.values())
    assert sum(recs[0]["dropped"].values()) >= 1, "no gradient was ever late"


@pytest.mark.slow
def test_backup_workers_with_a_dead_rank(tmp_path):
    codes, outs = gloo_ranks(4, "backup_worker.py", "nccl-strict", "dead", tmp_path, 1)
    assert codes[:3] == [0, 0, 0] and codes[3] == -9, (codes, TB.failures(codes, outs))
    recs, states = TB.load(tmp_path, "dead", range(3))
    # an error first: a rank that stopped on one also differs from the others, and its
    # error names the cause the state comparison cannot
    for r in recs:
        assert "error" not in r and r["missing"] == [3], r
        assert r["global_step"] == r["final"] == sum(r["applied"]) >= BW.DEAD_STEPS, r
    TB.assert_identical(states)


@pytest.mark.slow
def test_watchdog_aborts_a_groupend_stuck_on_a_peer_that_never_comes(tmp_path):
    """Rank 1 never reaches rank 0's first exchange: NCCL would block in groupEnd forever.
    The watchdog aborts the communicator at the 3 s timeout, the named error comes out, and
    leaving ``with commrt.init(...)`` (close, no destroy) ends the process at once."""
    codes, outs = gloo_ranks(2, "strict_worker.py", "stuck", tmp_path, timeout=120)
    assert codes == [0, 0], TB.failures(codes, outs)
    rec = json.loads((tmp_path / "stuck_rank0.json").read_text())
    assert "CommTimeoutError" in rec["error"] and "connection setup in groupEnd" in rec["error"]
    assert 2.9 <= rec["raised_after"] <= 3 + 3, rec
    assert rec["broken"] == "groupEnd timed out"
    assert rec["exited_at"] - rec["closing_at"] < 3, rec


# ------------------------------------------------------------ the stand-in's own rules
class _Store:
    """An in-memory store with TCPStore's calls (one process, threads as ranks)."""

    def __init__(self):
        self.d, self.lock = {}, threading.Lock()

    def set(self, k, v):
        with self.lock:
            self.d[k] = v.encode() if isinstance(v, str) else bytes(v)

    def get(self, k):
        with self.lock:
            return self.d[k]

    def check(self, keys):
        with self.lock:
            return all(k in self.d for k in keys)

    def delete_key(self, k):
        with self.lock:
            return self.d.pop(k, None) is not None


def test_group_depth_is_per_thread_and_groupend_blocks_until_abort():
    nccl = StrictNccl(_Store(), hang_s=2)
    other = []
    nccl.groupStart()
    t = threading.Thread(target=lambda: other.append(nccl.depth))
    t.start()
    t.join()
    assert nccl.depth == 1 and other == [0]
    nccl.groupEnd()
    # a lone rank of two: creation waits for rank 1, which never comes; abort is the way out
    box: dict = {}

    def create():
        try:
            box["comm"] = nccl.NcclCommunicator(2, b"\0" * 128, 0)
        except Exception as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=create, daemon=True)
    t.start()
    t.join(0.5)
    assert t.is_alive(), "communicator creation returned without rank 1"
    t.join(10)
    assert isinstance(box.get("error"), StandInHang), box  # real NCCL: forever


def test_completion_is_asynchronous_and_seen_through_events():
    store = _Store()
    nccl = [StrictNccl(store, hang_s=30) for _ in range(2)]
    comms: list = [None, None]
    ts = [
        threading.Thread(
            target=lambda r=r: comms.__setitem__(r, nccl[r].NcclCommunicator(2, b"\1" * 128, r))
        )
        for r in range(2)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    streams = [n.HostStream() for n in nccl]
    a, b = torch.arange(6.0), torch.zeros(6)
    # rank 1's receive first: its groupEnd (a new pair) waits for rank 0's matching send
    done = threading.Event()

    def rank1():
        nccl[1].groupStart()
        comms[1].recv(b.data_ptr(), 6, 7, 0, streams[1].ptr)
        nccl[1].groupEnd()
        done.set()

    t = threading.Thread(target=rank1, daemon=True)
    t.start()
    assert not done.wait(0.3), "groupEnd returned before the peer's matching group"
    blocker = threading.Event()
    streams[0].enqueue(blocker.wait)  # earlier work on rank 0's stream holds the send back
    nccl[0].groupStart()
    comms[0].send(a.data_ptr(), 6, 7, 1, streams[0].ptr)
    nccl[0].groupEnd()  # returns: completion is asynchronous
    assert done.wait(10)
    ev = streams[1].record()
    time.sleep(0.2)
    assert not ev.query() and torch.equal(b, torch.zeros(6)), "completed out of stream order"
    blocker.set()
    deadline = time.monotonic() + 10
    while not ev.query() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ev.query() and torch.equal(b, a)
    # destroy waits for pending work; abort unblocks a wait at once
    comms[0].abort()
    with pytest.raises(NcclAborted):
        nccl[0].wait_key("never", comms[0], "nothing", time.monotonic() + 30)
    assert isinstance(streams[0], HostStream)
