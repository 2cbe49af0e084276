"""Backup workers on 4 gloo ranks where participants die inside the all-reduce.

    backup_redo_worker.py SCENARIO OUTDIR BACKUPS

The test sets ``COMMRT_TEST_KILL`` (tests/helpers/faults.py): the named
ranks SIGKILL themselves right after their first send of global step
``KILL_AT``'s reduction. Ranks N..p-1 sleep ``SLOW_S`` before each backward
up to that step so that they are the late ranks and ranks 0..N-1 the
participants there (on a loaded machine a shorter delay let rank 1 come
last once: then nobody was killed).
The model's parameters start as small integers and every gradient is an
integer multiple of N, distinct per rank and global step (SGD with momentum,
lr 0.5), so every update is exact and the test replays it in float64.

* ``redo``: train ``STEPS`` iterations, then close; each survivor writes
  OUTDIR/redo_rank<r>.json (per step: global step, role, participants,
  redo rounds) and its final state in redo_rank<r>.pt.
* ``redo`` with ``COMMRT_TEST_KILL=...:STOP``: the named rank SIGSTOPs
  itself instead (a hung rank: its connections stay open); a helper wakes it
  ``WAKE_S`` seconds after it stopped (not after it started: a slow start must not wake
  it before the others record it dead). The survivors' records carry when
  each step ended (``at``) and when the fatal step began (``step_began``).
* ``toomany``: the same, but the killed ranks are more than the backups;
  each survivor records the error it got and when (error_at), and the time
  the fatal step began (step_began).
"""

import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import faults  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import BackupWorkers  # noqa: E402

STEPS = 7
KILL_AT = 3
SLOW_S = 1.0
#: the communicator's timeout (REDO_TIMEOUT_S: longer, so that a wait that lasts it shows)
TIMEOUT_S = float(os.environ.get("REDO_TIMEOUT_S", "6"))
DEAD_AFTER_S = 2.0
#: seconds a SIGSTOPped rank stays stopped: well past DEAD_AFTER_S, so the others have
#: recorded it dead when it wakes
WAKE_S = 10.0


def model():
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for i, p in enumerate(m.parameters()):
            p.copy_((torch.arange(p.numel()).reshape(p.shape) + i) % 7 - 3)
    return m


def grads(m, rank, g, n):
    """Integer gradients, multiples of n, distinct per rank and global step."""
    return [
        torch.full_like(p, float(n * ((rank + 1) * (g + 2) + 5 * i)))
        for i, p in enumerate(m.parameters())
    ]


def optimizer(m):
    return torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.5)


def main(scenario, out, backups):
    backups = int(backups)
    comm = commrt.init("gloo", timeout=TIMEOUT_S, abort_on_error=False)
    rank, n = comm.rank, comm.world_size - backups
    spec = os.environ.get("COMMRT_TEST_KILL", "")
    if spec.endswith(":STOP") and str(rank) in spec.split(":")[0].split(","):
        pid = os.getpid()  # the waker gives up if the rank ends without stopping
        wake = (
            f'until [ "$(ps -o state= -p {pid})" = T ]; do kill -0 {pid} || exit; sleep 0.05; done'
        )
        subprocess.Popen(["sh", "-c", f"{wake}; sleep {WAKE_S}; kill -CONT {pid}"])
    m = model()
    opt = optimizer(m)
    alg = BackupWorkers(backups=backups, dead_after_s=DEAD_AFTER_S)
    sync = commrt.GradientSync(m, comm, algorithm=alg, bucket_mb=0.0002, first_bucket_mb=0.0001)
    faults.arm(sync)
    rec = {"rank": rank, "buckets": len(sync.buckets), "steps": [], "applied": []}
    try:
        for _ in range(STEPS):
            g = sync.global_step
            if rank >= n and g <= KILL_AT:
                time.sleep(SLOW_S)
            if g == KILL_AT:
                rec["step_began"] = time.time()
            loss = sum((p * t).sum() for p, t in zip(m.parameters(), grads(m, rank, g, n)))
            loss.backward()
            rec["applied"].append(sync.step(opt))
            rec["steps"].append(dict(sync.stats.last.extra, computed_at=g, at=time.time()))
            if sync.policy.finished:
                break
        sync.close()
    except commrt.CommError as e:
        rec.update(error=str(e), error_type=type(e).__name__, error_at=time.time())
        sync.close()
    save(os.path.join(out, f"{scenario}_rank{rank}"), rec, sync, m, opt)


def save(path, rec, sync, m, opt):
    """Write ``rec`` with the report's numbers (path.json) and the final state (path.pt)."""
    rep = sync.policy.report()
    rec.update(global_step=sync.global_step, final=rep.final_step, missing=list(rep.missing))
    # global updates this rank's state went through: its own steps and the ones it caught up
    # on, in sync.step and in close() (where a rank that ran out of iterations catches up)
    rec["updates"] = rep.updates.get(sync.comm.rank)
    state = {f"param/{k}": v.detach().clone() for k, v in m.named_parameters()}
    for i, p in enumerate(m.parameters()):
        for k, v in opt.state.get(p, {}).items():
            state[f"state/{i}/{k}"] = v.detach().clone()
    torch.save(state, f"{path}.pt")
    with open(f"{path}.json", "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
