"""What a gloo group does when one member dies (3 ranks; rank 2 SIGKILLs itself).

    gloo_death_worker.py OUTDIR

Backup workers' redo rests on these facts (commrt/sync/backup/wire.py); each
surviving rank writes OUTDIR/rank<r>.json:

* ``pair_ok``: after rank 2's death, ranks 0 and 1 still exchange on the same
  group (gloo's pairs are independent);
* ``dead_recv_s``: a receive from the dead rank fails at once (seconds);
* ``aborted_s`` (rank 0): rank 1 aborts its group while rank 0 is blocked on
  a receive from it; rank 0's wait ends with an error after this many
  seconds (rank 1 waits ``ABORT_AFTER_S`` first), not at the timeout.
"""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from commrt.transports.gloo import GlooTransport

TIMEOUT_S = 20.0
ABORT_AFTER_S = 1.0


def main(out):
    rank = int(os.environ["RANK"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    store = dist.PrefixStore("gloo-death/", store)
    t = GlooTransport(store, rank, 3, TIMEOUT_S)
    for peer in range(3):  # every pair connected and used once
        if peer != rank:
            x = torch.full((4,), float(rank))
            got = torch.empty(4)
            pend = t.exchange([(x, peer)], [(got, peer)], tag=1)
            assert pend.wait_recv(0, time.monotonic() + TIMEOUT_S) and got[0] == peer
            pend.wait_send(0, time.monotonic() + TIMEOUT_S)
    store.set(f"ready/{rank}", "1")
    store.wait([f"ready/{r}" for r in range(3)])
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    rec = {"rank": rank}
    peer = 1 - rank
    got = torch.empty(4)
    pend = t.exchange([(torch.full((4,), 10.0 + rank), peer)], [(got, peer)], tag=2)
    deadline = time.monotonic() + TIMEOUT_S
    rec["pair_ok"] = pend.wait_recv(0, deadline) and pend.wait_send(0, deadline)
    rec["pair_ok"] = rec["pair_ok"] and got.tolist() == [10.0 + peer] * 4
    t0 = time.monotonic()
    try:
        t.exchange([], [(torch.empty(4), 2)], tag=3).wait_recv(0, t0 + TIMEOUT_S)
        rec["dead_recv_s"] = None
    except RuntimeError:
        rec["dead_recv_s"] = time.monotonic() - t0
    if rank == 1:
        time.sleep(ABORT_AFTER_S)
        t.abort()
    else:
        t0 = time.monotonic()
        try:
            t.exchange([], [(torch.empty(4), 1)], tag=4).wait_recv(0, t0 + TIMEOUT_S)
            rec["aborted_s"] = None
        except RuntimeError:
            rec["aborted_s"] = time.monotonic() - t0
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main(sys.argv[1])
