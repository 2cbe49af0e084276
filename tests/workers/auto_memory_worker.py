"""A job of gloo ranks whose ``auto`` settles two sizes: what it started from, what it kept.

    auto_memory_worker.py OUT_DIR

Started twice by tests/multiprocess/test_auto_memory_mp.py, with ``COMMRT_AUTO_MEMORY``
naming a file for rank 0 (and, to show that the others read rank 0's, an empty one for
them). Each rank writes OUT_DIR/rank<r>.json: per size, the label its learning started from,
whether that was an earlier job's verdict, the label it kept, the calls until it settled,
and whether every call's sum was right.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import commrt  # noqa: E402
from commrt.algorithms import Auto  # noqa: E402
from commrt.algorithms.auto import candidates, learning  # noqa: E402
from commrt.algorithms.auto_learn import calls_to_settle  # noqa: E402

SIZES = (8, 1 << 16)


def main(out_dir: str) -> None:
    comm = commrt.init("gloo", timeout=60)
    auto = Auto(recheck_s=None)
    p, rec = comm.world_size, {}
    for nbytes in SIZES:
        x, right, began, calls = torch.empty(nbytes // 4), True, None, 0
        for _ in range(calls_to_settle(len(candidates(p)))):
            calls += 1
            x.fill_(comm.rank + 1.0)
            commrt.all_reduce(x, comm, algorithm=auto, op="sum")
            right &= bool((x == p * (p + 1) / 2).all())
            tuning = learning(comm)[nbytes]
            began = began or tuning.choice
            if tuning.phase == "settled":
                break
        rec[nbytes] = {
            "began": began,
            "remembered": (auto, p, nbytes) in comm.slots.auto_remembered,
            "kept": tuning.kept,
            "calls": calls,
            "right": right,
        }
    comm.close()
    with open(os.path.join(out_dir, f"rank{comm.rank}.json"), "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main(sys.argv[1])
