"""How a worker process that ends by ``os._exit`` leaves without losing the others' reports.

Under mpiexec, a rank that exits without MPI_Finalize makes hydra kill every other rank
at once, silently and with exit code 0: a slower rank's report was then missing (seen in
CI). So such workers wait here until the reports they expect exist, and finalize MPI
before they leave.
"""

import json
import os
import time


def write_report(path: str, report: dict) -> None:
    """Write ``report`` as JSON atomically: a reader sees all of it or no file."""
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


def leave_when_written(paths, limit_s: float = 60.0) -> None:
    """``os._exit(0)`` once every file in ``paths`` exists, or after ``limit_s``; under
    mpiexec through MPI_Finalize, since ranks that all leave by ``os._exit`` at about the
    same time still race hydra (exit code 9 in about one run of three here)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
        time.sleep(0.05)
    if "PMI_RANK" in os.environ:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    os._exit(0)
