"""Backup workers on 4 gloo ranks: rank 1 dies, a replacement rejoins under its rank.

    backup_rejoin_worker.py OUTDIR BACKUPS

The job starts with ``COMMRT_TEST_KILL=1:KILL_AT`` (rank 1 SIGKILLs itself
inside global step KILL_AT's all-reduce, as in backup_redo_worker.py, whose
model, integer gradients and optimizer this reuses); the test starts a
replacement with ``RANK=1`` and ``COMMRT_REJOIN=1`` once rank 1 is gone. From
KILL_AT on, rank 3 sleeps ``SLOW_S`` before each backward: until the
replacement is back the three survivors are exactly the N = 3 every step
needs; afterwards rank 3 is the late one, so the replacement is on time and
its gradients count. Every rank (the replacement too) stops once it has seen
rank 1 on time in ``ON_TIME_AFTER`` global steps after the kill (or after
``MAX_ITERS`` iterations), then closes; the first to close ends training for
all. Each writes OUTDIR/rejoin_rank<r>[_<incarnation>].json (per step: the
global step it computed at, role, participants) and its final state (.pt).

``COMMRT_TEST_KILL_JOIN=1`` (the replacement's environment): it SIGKILLs
itself right after it came back (announced, before its snapshot), to show
that a replacement dying while it joins is survived like any other death.
"""

import os
import signal
import sys
import time

from backup_redo_worker import DEAD_AFTER_S, KILL_AT, SLOW_S, grads, model, optimizer, save
from helpers import faults  # on the path backup_redo_worker put it on

import commrt
from commrt.algorithms import BackupWorkers

TIMEOUT_S = 20.0
MAX_ITERS = 150
ON_TIME_AFTER = 3
SLOW_AFTER_S = 0.3


def main(out, backups):
    backups = int(backups)
    comm = commrt.init("gloo", timeout=TIMEOUT_S, abort_on_error=False)
    rank, n = comm.rank, comm.world_size - backups
    m = model()
    opt = optimizer(m)
    alg = BackupWorkers(backups=backups, dead_after_s=DEAD_AFTER_S)
    sync = commrt.GradientSync(m, comm, algorithm=alg, bucket_mb=0.0002, first_bucket_mb=0.0001)
    faults.arm(sync)
    inc = sync.policy.parts.liveness.incarnation
    if os.environ.get("COMMRT_TEST_KILL_JOIN"):
        os.kill(os.getpid(), signal.SIGKILL)
    rec = {"rank": rank, "incarnation": inc, "steps": [], "applied": []}
    seen = set()  # global steps after the kill with rank 1 on time
    try:
        for _ in range(MAX_ITERS):
            g = sync.global_step
            if rank >= n:
                time.sleep(SLOW_S if g <= KILL_AT else SLOW_AFTER_S)
            loss = sum((p * t).sum() for p, t in zip(m.parameters(), grads(m, rank, g, n)))
            loss.backward()
            rec["applied"].append(sync.step(opt))
            extra = sync.stats.last.extra
            rec["steps"].append(dict(extra, computed_at=g))
            if g > KILL_AT and 1 in extra["participants"] and extra["role"] != "joining":
                seen.add(g)
            if sync.policy.finished or len(seen) >= ON_TIME_AFTER:
                break
        sync.close()
    except commrt.CommError as e:
        rec.update(error=str(e), error_type=type(e).__name__)
        sync.close()
    name = f"rejoin_rank{rank}" + (f"_{inc}" if inc else "")
    save(os.path.join(out, name), rec, sync, m, opt)


if __name__ == "__main__":
    main(*sys.argv[1:])
