"""How a worker process that ends by ``os._exit`` leaves without losing the others' reports.

Under mpiexec, a rank that exits without MPI_Finalize makes hydra kill every other rank
at once, silently and with exit code 0: a slower rank's report was then missing (seen in
CI). So such workers wait here until the reports they expect exist, and finalize MPI
before they leave.
"""

import json
import os
import sys
import time


def write_report(path: str, report: dict) -> None:
    """Write ``report`` as JSON atomically: a reader sees all of it or no file."""
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


def leave_when_written(paths, limit_s: float = 60.0) -> None:
    """``os._exit(0)`` once every file in ``paths`` exists, or after ``limit_s``.

    Under mpiexec, through MPI_Finalize and then the C library's ``exit``: ranks that all
    leave by ``os._exit`` at about the same time still race hydra (exit code 9 in about one
    run of three here), and so do ranks that finalize and then ``os._exit`` a fraction of a
    second apart (3 ranks 0.2 s apart: killed in 4 runs of 4). ``exit`` runs MPICH's own
    exit handlers and none of Python's teardown (0 of 7)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
        time.sleep(0.05)
    if "PMI_RANK" in os.environ:
        import ctypes

        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
        sys.stdout.flush()
        sys.stderr.flush()
        ctypes.CDLL(None).exit(0)
    os._exit(0)
