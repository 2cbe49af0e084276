"""Run under mpiexec: the last rank stops taking part; the others must time out.

argv: out_dir timeout_s. Each live rank writes <out_dir>/rank<r>.json with,
per transport, how long the all_reduce took to fail and the error's fields.
Processes leave with os._exit: requests to the dead peer are still posted
and MPI_Finalize would wait on them.
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
    with open(os.path.join(out_dir, f"rank{comm.rank}.json"), "w") as f:
        json.dump(report, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
