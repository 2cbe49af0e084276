"""A 2-rank torchrun job whose ranks call with mismatched sizes: each rank says its error
once (the traceback, then one line naming the rank and the exit), not again in that line."""

import os
import socket
import subprocess
import sys

import pytest

#: (script, per rank: a text found only in that rank's error message)
CASES = {
    "all_reduce": (
        """
import torch, torch.distributed as dist
import commrt
dist.init_process_group("commrt")
dist.all_reduce(torch.ones(10 + dist.get_rank()))
""",
        [
            "commrt: rank 0 called all_reduce(shape=[10]",
            "commrt: rank 1 called all_reduce(shape=[11]",
        ],
    ),
    # DDP's own check names the mismatch on rank 1; rank 0 then finds its peer gone
    "ddp": (
        """
import torch, torch.distributed as dist
import commrt
dist.init_process_group("commrt")
n = 32 + dist.get_rank()
model = torch.nn.Sequential(torch.nn.Linear(n, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp(torch.randn(8, n)).sum().backward()
""",
        ["commrt: rank 0: gloo failed in algorithm auto", "appears not to match sizes"],
    ),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c == "ddp" else c for c in sorted(CASES)]
)
def test_each_rank_prints_its_mismatch_error_once(case, tmp_path):
    script, marks = CASES[case]
    path = tmp_path / "job.py"
    path.write_text(script)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(_port()), str(path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMRT_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    counts = [sum(mark in line for line in out.splitlines()) for mark in marks]
    # torchrun may stop a rank before it prints, once the other has failed: at most once
    # each, and said at all by the rank that found the mismatch first
    assert max(counts) == 1, (counts, out[-4000:])
    # every line that ends the job points at the error printed above it: an uncaught one,
    # or the one in a future nothing waits for (rank 0's broadcast inside DDP's constructor
    # when rank 1 failed first: its own message, then the farewell after it)
    last = [line for line in out.splitlines() if "ending the whole job" in line]
    why = (
        "the uncaught ",
        "(DDP holds only its future); ",
        "ending the whole job after the error above",
    )
    assert last and all(any(w in line for w in why) for line in last), out
    assert any("the uncaught " in line and " above; " in line for line in last), out
