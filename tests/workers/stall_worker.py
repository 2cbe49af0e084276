"""Run under mpiexec: the last rank stops taking part; the others must time out.

argv: out_dir timeout_s. Each live rank writes <out_dir>/rank<r>.json with,
per transport, how long the all_reduce took to fail and the error's fields.
The staller leaves with os._exit; the others through tests/workers/leaving.py
once every live rank wrote its report.
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from leaving import leave_when_written, write_report  # noqa: E402

import commrt  # noqa: E402


def main(out_dir, timeout):
    comms = {
        "mpi": commrt.init("mpi", timeout=timeout),
        "gloo": commrt.init("gloo", timeout=timeout),
    }
    comm = comms["mpi"]
    staller = comm.world_size - 1
    comm.barrier()
    if comm.rank == staller:
        time.sleep(3 * timeout + 2)  # alive, but never calls the collective
        os._exit(0)
    report = {}
    for name, c in comms.items():
        t = torch.ones(10_000)
        start = time.monotonic()
        try:
            commrt.all_reduce(t, c, algorithm="ring")
            report[name] = {"error": None}
        except commrt.CommTimeoutError as e:
            report[name] = {
                "elapsed": time.monotonic() - start,
                "message": str(e),
                "rank": e.rank,
                "peer": e.peer,
                "algorithm": e.algorithm,
                "step": e.step,
                "what": e.what,
            }
    write_report(os.path.join(out_dir, f"rank{comm.rank}.json"), report)
    sys.stdout.flush()
    leave_when_written([os.path.join(out_dir, f"rank{r}.json") for r in range(staller)])


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
