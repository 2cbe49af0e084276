"""A rank that ends without closing its communicator (argv: output folder, then
``plain`` or ``backup``).

It makes a gloo communicator (whose stall watch beats to the job's store) and runs one
all-reduce; with ``backup`` also one step of a backup workers' GradientSync (whose
heartbeat thread beats to the store too), never closed. It writes what its threads are
and returns from main with everything open: the interpreter's exit must then neither
hang nor abort."""

import json
import os
import sys
import threading

import torch

import commrt


def main(out: str, case: str) -> None:
    comm = commrt.init("gloo", timeout=60, abort_on_error=False)
    t = torch.ones(4)
    commrt.all_reduce(t, comm, op="sum")
    if case == "backup":
        from commrt.algorithms import BackupWorkers

        model = torch.nn.Linear(4, 2)
        sync = commrt.GradientSync(model, comm, algorithm=BackupWorkers(backups=1))
        model(torch.ones(3, 4)).sum().backward()
        sync.step(torch.optim.SGD(model.parameters(), lr=0.1))
    threads = {th.name: th.daemon for th in threading.enumerate()}
    report = {"sum": t.tolist(), "threads": threads}
    with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
