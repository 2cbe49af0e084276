"""The MPI NCCL stand-in is never kinder than NCCL (tests/workers/standin_worker.py).

It creates a communicator collectively over that communicator's ranks only (a
subset hangs, and it names who never came), keeps each communicator's messages
apart from another's between the same ranks, and completes a group on its
stream's worker thread, after ``groupEnd`` has returned. This checks the
stand-in that commrt's NCCL adapter is tested on, not NCCL.
"""

from __future__ import annotations

import json

import pytest
from helpers.mp import mpiexec

pytestmark = pytest.mark.mpi


def test_the_mpi_stand_in_keeps_nccls_rules(tmp_path):
    mpiexec(3, "standin_worker.py", tmp_path, timeout=180)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    for r in (0, 1):
        assert "waits for ranks [2], which never called it" in reports[r]["subset"], reports[r]
    assert reports[2]["subset"] == "stayed out"
    # each message through its own communicator, whatever order the two ranks issued them
    assert reports[0]["pair"] == [[2.0] * 3, [12.0] * 5]
    assert reports[2]["pair"] == [[0.0] * 3, [10.0] * 5]
    assert reports[0]["async"] == [[0.0] * 4, [7.0] * 4]  # nothing yet, then the data
