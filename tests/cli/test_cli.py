"""The command line end to end: commrt train on 2 real ranks, bench plots, flag errors,
the progress output at 80 columns, and a rank killed mid-run."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers.cli import parse_summary, rank_pid, run_commrt, run_in_pty, start_commrt, statements

from commrt.cli import main

ACCURACY_THRESHOLD = 0.90  # digits MLP, 4 epochs: ~0.95-0.97 measured


@pytest.mark.mpi
@pytest.mark.parametrize(
    "algorithm,backend",
    [
        ("ring", "mpi"),
        ("ring", "gloo"),
        ("halving_doubling", "mpi"),
        ("torus2d", "mpi"),
        ("auto", "mpi"),
    ],
)
@pytest.mark.slow
def test_train_end_to_end(algorithm, backend, tmp_path):
    from commrt.algorithms import NAMES

    if algorithm not in NAMES:
        pytest.fail(f"{algorithm} is not registered")
    trace = tmp_path / "trace.json"
    proc = run_commrt(
        "train",
        "--nproc",
        "2",
        "--backend",
        backend,
        "--algorithm",
        algorithm,
        "--epochs",
        "4",
        "--trace",
        str(trace),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = parse_summary(proc.stdout)
    assert float(s["final test accuracy"]) >= ACCURACY_THRESHOLD, proc.stdout
    assert s["ranks × backend"] == f"2 × {backend}"
    assert s["trace"] == str(trace) and trace.exists()
    assert "exposed (blocked in wait)" in proc.stdout and "samples/s" in s["throughput"]
    # the start-up, phase by phase: the phases add up to it
    phases = re.findall(r"^  (processes and imports|meeting the other ranks|data and model|"
                        r"broadcasting the model)\s+([\d.]+) s$", proc.stdout, re.M)  # fmt: skip
    assert len(phases) == 4, proc.stdout
    total = float(s["start-up"].split()[0])
    assert abs(sum(float(t) for _, t in phases) - total) <= 0.03, proc.stdout
    # the step's parts add up to it; sizes in the one binary unit system
    step = float(s["time per step"].split()[0])
    compute, exposed = (
        float(re.search(rf"^  {re.escape(k)}\s+([\d.]+) ms", proc.stdout, re.M)[1])
        for k in ("compute (fwd+bwd+opt)", "exposed (blocked in wait)")
    )
    assert abs(compute + exposed - step) <= 0.002, proc.stdout
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB) per rank", s["bytes sent per step"]), proc.stdout


def test_bench_allreduce_writes_a_png(tmp_path):
    png = tmp_path / "allreduce.png"
    proc = run_commrt(
        "bench",
        "allreduce",
        "--nproc",
        "2",
        "--backend",
        "gloo",
        "--sizes",
        "64K,256K",
        "--repeats",
        "1",
        "--iters",
        "5",
        "--plot",
        str(png),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "busbw" in proc.stdout and "native (gloo allreduce)" in proc.stdout
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_bench_kernels_table(tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "kernels",
                "--sizes",
                "1M",
                "--device",
                "cpu",
                "--plot",
                str(tmp_path / "k.png"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "pack/copy" in out and "1 MiB" in out and (tmp_path / "k.png").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--algorithm", "gosip"], "unknown algorithm 'gosip'"),
        (["train", "--algorithm", "gossip", "--nproc", "6"], "power-of-two number of ranks, got 6"),
        (["train", "--gossip-async"], "only apply to --algorithm gossip"),
        (
            ["train", "--algorithm", "torus2d", "--torus-shape", "3x2", "--nproc", "4"],
            "rows × cols must equal p",
        ),
        (["train", "--torus-shape", "2x2"], "only applies to --algorithm torus2d"),
        (["train", "--batch-size", "65", "--nproc", "2"], "batch size"),
        (["train", "--straggler", "5:0.1"], "outside 0..1"),
        (["train", "--straggler", "x"], "bad --straggler"),
        (["train", "--nproc", "0"], "must be at least 1"),
        (["train", "--batch-size", "2000"], "larger than the 1438 training samples"),
        (
            ["train", "--batch-schedule", "0:64,2:4000", "--epochs", "3"],
            "global batch at epoch 2 is 4000",
        ),
        (["bench", "allreduce", "--sizes", "12Q"], "bad size"),
        (["bench", "allreduce", "--algorithms", "ring,nope"], "unknown algorithm 'nope'"),
        (["bench", "allreduce", "--algorithms", "ring,gossip"], "gossip is not an all-reduce"),
    ],
)
def test_bad_flags_get_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()), err  # the error is wrapped at 80 columns
    # the subcommand names itself and shows its own usage
    command = " ".join(a for a in argv[:2] if not a.startswith("-"))
    assert f"commrt {command}: error:" in err and f"usage: commrt {command}" in err, err


@pytest.mark.parametrize(
    "argv", [[], ["train"], ["bench", "allreduce"], ["simulate"], ["trace", "merge"]]
)
def test_help_has_no_raw_markup(argv, capsys):
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert "usage: commrt" in out and "``" not in out and ":func:" not in out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_nccl_without_gpu_suggests_shm_gloo_or_mpi(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--backend", "nccl"])
    err = " ".join(capsys.readouterr().err.split())
    assert "needs a CUDA GPU" in err and "--backend shm (the ranks on this host" in err
    assert "gloo or mpi, or leave --backend out" in err


@pytest.mark.mpi
@pytest.mark.slow
def test_train_runs_as_one_rank_under_mpiexec():
    import shutil

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        [
            shutil.which("mpiexec"),
            "-n",
            "2",
            sys.executable,
            "-m",
            "commrt",
            "train",
            "--epochs",
            "3",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = parse_summary(proc.stdout)
    # auto under mpiexec on one host: shared memory (commrt.runtime.choice), as init takes it
    assert s["ranks × backend"] == "2 × shm" and float(s["final test accuracy"]) >= 0.85


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
@pytest.mark.slow
def test_train_output_fits_an_80_column_terminal(backend):
    epochs = 5
    rc, out = run_in_pty(
        [sys.executable, "-m", "commrt", "train", "--backend", backend, "--epochs", str(epochs)]
    )
    assert rc == 0, out[-3000:]
    lines = out.replace("\r\n", "\n").split("\n")
    assert lines[0].startswith(f"starting 2 ranks ({backend})"), lines[:3]
    # every redraw of the bar fits the width, so nothing wraps
    for line in lines:
        for frame in line.split("\r"):
            assert len(frame.rstrip()) <= 80, repr(frame)
    summary_at = next(i for i, ln in enumerate(lines) if "commrt train summary" in ln) - 1
    progress = [ln for ln in lines[1:summary_at] if ln.strip("\r ")]
    # the start-up's phases rank 0 named while it was slow come before the bar, if at all
    named = [ln for ln in progress if re.match(r"^ +[\d.]+ s  [a-z].*…$", ln)]
    assert progress[: len(named)] == named, progress
    progress = progress[len(named) :]
    # a line per epoch, each once; on a terminal (gloo) the bar stays below them as well
    done = [p.split("\r")[-1] for p in progress if p.split("\r")[-1].startswith("epoch ")]
    assert [d.split()[1] for d in done] == [f"{e}/{epochs}" for e in range(1, epochs + 1)], progress
    assert len(progress) == epochs + (backend == "gloo"), progress
    assert lines[-2].startswith("commrt train: done "), lines[-3:]
    assert float(parse_summary(out.replace("\r", ""))["final test accuracy"]) > 0.5


@pytest.mark.slow
def test_train_names_a_rank_killed_mid_run():
    proc = start_commrt("train", "--backend", "gloo", "--epochs", "200", "--timeout", "20")
    try:
        first = proc.stdout.readline()
        assert first.startswith("starting 2 ranks"), first
        line = proc.stdout.readline()
        while re.match(r"^ +[\d.]+ s  [a-z].*…$", line):  # a start-up phase rank 0 named
            line = proc.stdout.readline()
        assert line.startswith("epoch 1/200"), f"training did not start: {line!r}"
        victim = rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 30
    tail = statements(err)[-3:]  # (a statement may wrap at 80 columns)
    assert "commrt: rank 1 was killed by SIGKILL" in tail[0], err[-2000:]
    assert tail[-1].startswith("commrt: stopped the other ranks"), tail
