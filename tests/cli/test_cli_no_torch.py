"""What commrt's command line imports: a flag error answers without importing torch (it
took 4.9 s to say "did you mean 'ring'" for ``--algorithm rign``, the time of torch's
import, where other flag errors took 0.3 s), and the launcher of ``commrt train`` never
imports torch: only its ranks do, each once (they imported it after the launcher had)."""

import os
import subprocess
import sys

import pytest

#: runs commrt's main in this process, then says whether torch was imported
WRAPPER = (
    "import sys\n"
    "from commrt.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "print('torch imported:', 'torch' in sys.modules, flush=True)\n"
    "sys.exit(code)\n"
)


def _commrt(tmp_path, *argv, timeout=300):
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMRT_", "RANK"))}
    env.update(OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(script), *argv], capture_output=True, text=True,
        timeout=timeout, env=env, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--algorithm", "rign"], "did you mean 'ring'"),
        (["--kill", "9:1"], "--kill 9:1: the rank must be in 0..1"),
        (["--straggler", "3:0.1"], "--straggler names a rank outside"),
        (["--batch-size", "5000"], "larger than the 1438 training samples"),
        (["--max-restarts", "1"], "--max-restarts needs --algorithm backup"),
    ],
)
def test_a_flag_error_answers_without_importing_torch(tmp_path, argv, said):
    proc = _commrt(tmp_path, "train", *argv, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in " ".join(proc.stderr.split()), proc.stderr
    assert "torch imported: False" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_the_launcher_of_commrt_train_never_imports_torch(tmp_path):
    proc = _commrt(tmp_path, "train", "--nproc", "2", "--epochs", "1", "--quiet")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "commrt train summary" in proc.stdout  # the ranks trained: they imported torch
    assert proc.stdout.rstrip().endswith("torch imported: False"), proc.stdout[-2000:]
