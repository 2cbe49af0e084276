"""The command line end to end: commrt train on 2 real ranks, bench plots, flag errors."""
import os
import re
import subprocess
import sys

import pytest

from commrt.cli import main

ACCURACY_THRESHOLD = 0.90   # digits MLP, 4 epochs: ~0.95-0.97 measured


def _commrt(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-m", "commrt", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _summary(out: str) -> dict:
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(.+)$", line)
        if m:
            rows[m.group(1).strip()] = m.group(2).strip()
    return rows


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm,backend", [("ring", "mpi"), ("ring", "gloo"), ("halving_doubling", "mpi"),
                                               ("torus2d", "mpi"), ("auto", "mpi")])
def test_train_end_to_end(algorithm, backend, tmp_path):
    from commrt.algorithms import NAMES
    if algorithm not in NAMES:
        pytest.fail(f"{algorithm} is not registered")
    trace = tmp_path / "trace.json"
    proc = _commrt("train", "--nproc", "2", "--backend", backend, "--algorithm", algorithm, "--epochs", "4",
                   "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = _summary(proc.stdout)
    assert float(s["final test accuracy"]) >= ACCURACY_THRESHOLD, proc.stdout
    assert s["ranks × backend"] == f"2 × {backend}"
    assert s["trace"] == str(trace) and trace.exists()
    assert "exposed (blocked in wait)" in proc.stdout and "samples/s" in s["throughput"]


def test_bench_allreduce_writes_a_png(tmp_path):
    png = tmp_path / "allreduce.png"
    proc = _commrt("bench", "allreduce", "--nproc", "2", "--backend", "gloo", "--sizes", "64K,256K",
                   "--repeats", "1", "--iters", "5", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "busbw" in proc.stdout and "native (gloo allreduce)" in proc.stdout
    import matplotlib.image
    img = matplotlib.image.imread(str(png))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_bench_kernels_table(tmp_path, capsys):
    assert main(["bench", "kernels", "--sizes", "1M", "--device", "cpu", "--plot", str(tmp_path / "k.png")]) == 0
    out = capsys.readouterr().out
    assert "pack/copy" in out and "1 MiB" in out and (tmp_path / "k.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["train", "--algorithm", "gossip"], "unknown algorithm 'gossip'"),
    (["train", "--algorithm", "torus2d", "--torus-shape", "3x2", "--nproc", "4"], "rows × cols must equal p"),
    (["train", "--torus-shape", "2x2"], "only applies to --algorithm torus2d"),
    (["train", "--batch-size", "65", "--nproc", "2"], "batch size"),
    (["train", "--straggler", "5:0.1"], "outside 0..1"),
    (["train", "--straggler", "x"], "bad --straggler"),
    (["train", "--nproc", "0"], "must be at least 1"),
    (["bench", "allreduce", "--sizes", "12Q"], "bad size"),
])
def test_bad_flags_get_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_nccl_without_gpu_suggests_mpi_or_gloo(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--backend", "nccl"])
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--backend mpi or gloo" in err


@pytest.mark.mpi
def test_train_runs_as_one_rank_under_mpiexec():
    import shutil
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([shutil.which("mpiexec"), "-n", "2", sys.executable, "-m", "commrt", "train", "--epochs", "3",
                           "--quiet"], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = _summary(proc.stdout)
    assert s["ranks × backend"] == "2 × mpi" and float(s["final test accuracy"]) >= 0.85
