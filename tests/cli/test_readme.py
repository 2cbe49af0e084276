"""The README holds: its training-loop example runs as printed, on 2 real ranks,
and every rank ends with the same weights even though nobody seeded the model."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    assert re.search(r"&& python -m pytest( -n \d+ --dist loadgroup)?$", commands[1].strip())
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert commands[1].strip() in f.read()
    # and it is the parallel one: pyproject's addopts run the suite on xdist's workers
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert re.search(r'^addopts = ".*-n auto --dist loadgroup', f.read(), re.M)


def _run_example(heading: str, nranks: int, report: str, tmp_path) -> tuple[str, str]:
    """Run the README's first python block under ``heading`` on ``nranks`` MPI ranks, with
    ``report`` (a print of the weights' fingerprint) appended; return (code, stdout)."""
    section = _readme().split(heading, 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(
        code + "\nw = torch.cat([p.detach().flatten() for p in model.parameters()])\n" + report
    )
    proc = subprocess.run(
        [shutil.which("mpiexec"), "-n", str(nranks), sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return code, proc.stdout


@pytest.mark.mpi
def test_training_loop_example_runs_on_two_ranks(tmp_path):
    # run the example as printed, then report a fingerprint of the weights each rank ends with
    report = "print(f'rank {comm.rank} steps {len(sync.stats.steps)} weights {w.double().sum().item():.12e}')\n"
    _, out = _run_example("## Use it in a training loop", 2, report, tmp_path)
    found = {r: (n, w) for r, n, w in re.findall(r"rank (\d) steps (\d+) weights " + FLOAT, out)}
    assert set(found) == {"0", "1"}, out
    assert found["0"] == found["1"], found  # one model, not two
    assert int(found["0"][0]) == 4096 // 32 // 2  # each rank took its half of the batches


@pytest.mark.mpi
@pytest.mark.slow
def test_gossip_example_runs_on_four_ranks_and_ends_with_one_model(tmp_path):
    # four ranks: at p = 2 the one peer is everybody, and gossip is an exact average
    report = "print(f'rank {comm.rank} weights {w.double().sum().item():.12e}')\n"
    heading = "### Gossip (GossipGraD) in your own loop"
    code, out = _run_example(heading, 4, report, tmp_path)
    assert max(map(len, code.splitlines())) <= 80, "the example fits an 80-column terminal"
    apart = [float(a) for a in re.findall(r"the models were " + FLOAT + " apart", out)]
    assert len(apart) == 3 and apart[0] > 0, out  # they drifted, then agreed again
    found = dict(re.findall(r"rank (\d) weights " + FLOAT, out))
    assert set(found) == {"0", "1", "2", "3"} and len(set(found.values())) == 1, out


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
