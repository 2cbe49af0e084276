"""A rank killed with SIGKILL under torchrun itself (tests/workers/torchrun_kill_worker.py):
every survivor gives the verdict that names the dead rank, first and without a long
traceback, though torchrun stops it (SIGTERM) a tenth of a second after the death; and
torchrun's own "Root Cause" block carries that verdict, not only "Signal 9".

Each rank's output goes to its own file (``--redirects 3``), so that each survivor's is
checked alone; torchrun's summary is on its stderr."""

import glob
import os
import re
import subprocess
import sys

import pytest
from helpers.mp import TESTS

#: seconds the job gets (torch starts slowly on a loaded machine; the job itself takes a few)
BOUND_S = 240
#: the most traceback frames a survivor may print
MOST_FRAMES = 10
#: what names rank 1 dead: the verdict in full, or the line that points to it
DEAD = re.compile(r"root cause: rank 1 \(host [^)]*\) is DEAD|stall verdict \([^)]*\): rank 1 "
                  r"\(host [^)]*\) is DEAD")  # fmt: skip


def torchrun_kill(mode: str, tmp_path) -> tuple[str, dict[int, str]]:
    """Run the worker under torchrun; (torchrun's own output, {rank: that rank's output})."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    cmd += ["--log-dir", str(logs), "--redirects", "3"]
    cmd += [os.path.join(TESTS, "workers", "torchrun_kill_worker.py"), mode]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMRT_", "TORCH_DIST"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S)
    outs = {}
    for r in range(3):
        files = sorted(glob.glob(str(logs / "*" / "attempt_0" / str(r) / "std*.log")))
        outs[r] = "".join(open(f).read() for f in files)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr, outs


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("mode", ["sync", pytest.param("ddp", marks=pytest.mark.slow)])
def test_every_survivor_of_a_killed_rank_under_torchrun_names_it_dead_first(mode, tmp_path):
    said, outs = torchrun_kill(mode, tmp_path)
    assert "killed at" in outs[1], outs[1]
    for rank in (0, 2):
        out = outs[rank]
        verdict = DEAD.search(flat(out))
        assert verdict, f"rank {rank} never named rank 1 dead:\n{out}\n--- torchrun:\n{said}"
        frames = re.findall(r'^\s*File "', out, re.M)
        assert len(frames) <= MOST_FRAMES, f"rank {rank}: {len(frames)} frames:\n{out}"
        if "Traceback" in out:  # the verdict comes first, a traceback (if any) after it
            assert flat(out).index(verdict.group(0)) < flat(out).index("Traceback"), out
        assert "finished" not in out, out
    # torchrun's summary: its root cause is commrt's verdict, which names rank 1 dead
    root = said[said.index("Root Cause (first observed failure):") :]
    assert "root cause: rank 1 (host" in root and "is DEAD" in root, said


@pytest.mark.slow  # torchrun stays in the quick loop: the killed rank above
def test_a_setting_refused_at_the_start_is_torchruns_root_cause(tmp_path):
    """``COMMRT_ALGORITHM=rnig`` under torchrun: every rank refuses it in
    ``init_process_group``, and torchrun's "Root Cause" block says so, with the nearest
    algorithm, rather than "To enable traceback see ..."."""
    script = tmp_path / "job.py"
    script.write_text("import torch.distributed as dist\n\nimport commrt\n\n"
                      "dist.init_process_group('commrt')\n")  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMRT_", "TORCH_DIST"))}
    env.update(OMP_NUM_THREADS="1", COMMRT_ALGORITHM="rnig")
    proc = subprocess.run([*cmd, str(script)], env=env, capture_output=True, text=True,
                          timeout=BOUND_S)  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Root Cause" in said, said
    root = flat(said[said.index("Root Cause") :])
    assert "COMMRT_ALGORITHM='rnig'" in root and "did you mean 'ring'" in root, said
