"""A gloo rank of gossip with a deadline whose rank 1 dies and is replaced.

    gossip_rejoin_worker.py OUT_DIR [async]

Started by tests/multiprocess/test_gossip_rejoin.py with a store hosted by
the test (so that a replacement finds it). Rank 1 SIGKILLs itself before
step KILL_AT. The survivors hold before step HOLD_AT (mid-period) until a replacement has
taken its incarnation (``inc/1`` in the store: a process start takes
seconds), then train to step STEPS. The replacement (``COMMRT_REJOIN=1``)
runs from the step it is given to STEPS too.

Each rank saves OUT_DIR/rank<r>[.replacement].json: per step (the job's
step), its (send_to, recv_from); the first step at whose start the
replacement's return was in the store's log (survivors); the step from which
it admitted rank 1 (survivors); its ledger; whether its optimizer held state
after its first step.
"""

import json
import os
import signal
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.gossip import gossip_model, gossip_targets  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import Gossip  # noqa: E402
from commrt.process.environment import rejoining  # noqa: E402
from commrt.runtime.store import ControlStore  # noqa: E402
from commrt.sync.gossip.deaths import PREFIX  # noqa: E402

KILL_AT, HOLD_AT, STEPS = 4, 9, 30
DEADLINE_S = 0.05


def back_in_log(store) -> bool:
    n = int(store.add("ndead", 0))
    keys = [f"dead/{i}" for i in range(1, n + 1)]
    return any(store.check([k]) and b"back" in store.get(k) for k in keys)


def main(out_dir: str, mode: str = "sync") -> None:
    comm = commrt.init("gloo", timeout=120)
    replacement = rejoining()
    alg = Gossip(
        topology="hypercube",
        rotate=True,
        seed=5,
        deadline_s=DEADLINE_S,
        asynchronous=mode == "async",
    )
    model = gossip_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    sync = commrt.GradientSync(model, comm, algorithm=alg, bucket_mb=0.02, first_bucket_mb=0.005)
    store = ControlStore.open(comm).client(PREFIX)
    rec = {"peers": {}, "seen_back": None, "state_after_first": None}
    step = sync.global_step
    while step < STEPS:
        if comm.rank == 1 and step == KILL_AT and not replacement:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == HOLD_AT and not replacement:
            while not store.check(["inc/1"]):
                time.sleep(0.05)
        if not replacement and rec["seen_back"] is None and back_in_log(store):
            rec["seen_back"] = step
        time.sleep(0.02)
        sum(
            (q * t).sum()
            for q, t in zip(model.parameters(), gossip_targets(model, comm.rank, step))
        ).backward()
        sync.step(opt)
        if rec["state_after_first"] is None:
            rec["state_after_first"] = len(opt.state) > 0
        st = sync.policy.step_stats()
        rec["peers"][st["gossip_step"]] = (st["send_to"], st["recv_from"])
        step = sync.global_step
    sync.close()
    rec["admitted_from"] = sync.policy.members.joins
    rec["ledger"] = sync.policy.ledger.as_dict()
    rec["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    name = f"rank{comm.rank}{'.replacement' if replacement else ''}.json"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(rec, f, default=str)
    comm.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
