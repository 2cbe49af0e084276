"""The README holds: its training-loop example runs as printed, on 2 real ranks,
and every rank ends with the same weights even though nobody seeded the model."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_readme_has_exactly_two_setup_commands():
    setup = _readme().split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert len(commands) == 2, commands
    assert commands[0].strip().endswith("commrt train")
    assert commands[1].strip().endswith("python -m pytest")
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert commands[1].strip() in f.read()


@pytest.mark.mpi
def test_training_loop_example_runs_on_two_ranks(tmp_path):
    section = _readme().split("## Use it in a training loop", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    # run the example as printed, then report a fingerprint of the weights each rank ends with
    script = tmp_path / "train.py"
    script.write_text(
        code + "\nw = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "print(f'rank {comm.rank} steps {len(sync.stats.steps)} weights {w.double().sum().item():.12e}')\n"
    )
    proc = subprocess.run(
        [shutil.which("mpiexec"), "-n", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {
        r: (n, w) for r, n, w in re.findall(r"rank (\d) steps (\d+) weights (\S+)", proc.stdout)
    }
    assert set(found) == {"0", "1"}, proc.stdout
    assert found["0"] == found["1"], found  # one model, not two
    assert int(found["0"][0]) == 4096 // 32 // 2  # each rank took its half of the batches
