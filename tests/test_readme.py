"""The README holds: its training-loop example runs as printed, on 2 real ranks,
and every rank ends with the same weights even though nobody seeded the model."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: a printed float, matched exactly: mpiexec may join two ranks' lines ("...e-01rank 0 ...")
FLOAT = r"(-?\d+(?:\.\d+)?(?:e[+-]\d+)?)"


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
        r: (n, w) for r, n, w in re.findall(r"rank (\d) steps (\d+) weights " + FLOAT, proc.stdout)
    }
    assert set(found) == {"0", "1"}, proc.stdout
    assert found["0"] == found["1"], found  # one model, not two
    assert int(found["0"][0]) == 4096 // 32 // 2  # each rank took its half of the batches


@pytest.mark.mpi
def test_gossip_example_runs_on_four_ranks_and_ends_with_one_model(tmp_path):
    # four ranks: at p = 2 the one peer is everybody, and gossip is an exact average
    section = _readme().split("### Gossip (GossipGraD) in your own loop", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert max(map(len, code.splitlines())) <= 80, "the example fits an 80-column terminal"
    script = tmp_path / "gossip.py"
    script.write_text(
        code + "\nw = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "print(f'rank {comm.rank} weights {w.double().sum().item():.12e}')\n"
    )
    proc = subprocess.run(
        [shutil.which("mpiexec"), "-n", "4", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    apart = [float(a) for a in re.findall(r"the models were " + FLOAT + " apart", proc.stdout)]
    assert len(apart) == 3 and apart[0] > 0, proc.stdout  # they drifted, then agreed again
    found = dict(re.findall(r"rank (\d) weights " + FLOAT, proc.stdout))
    assert set(found) == {"0", "1", "2", "3"} and len(set(found.values())) == 1, proc.stdout


def test_what_the_commands_write_by_default_is_ignored_by_git():
    """The README's commands leave nothing untracked: simulate's figures, the trace the
    summary suggests and the per-rank traces beside it all go under out/, which git
    ignores."""
    from commrt.cli.commands import build_parser

    sim = build_parser().parse_args(["simulate"])
    paths = [
        os.path.join(sim.out_dir, "sim_time_vs_p.png"),
        "out/trace.json",
        "out/trace.ranks/rank0.json",
    ]
    assert _readme().count("--trace out/trace.json") >= 1
    proc = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.stdout.split() == paths, (proc.stdout, proc.stderr)
