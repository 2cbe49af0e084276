"""tools/gpu_check.py as the GPU machine will run it, as far as a CPU machine can show.

The GPU machine gets a copy of the working tree, has no network and no commrt
installed, and has torch, Triton, cupy, NCCL and pytest installed already.
Here: a copy of the tree (the files git tracks or would track, as the copy
sent there), a fresh virtual environment that sees the installed packages
through a plain path entry (so this checkout's own editable install of
commrt, whose finder is set up by a ``.pth`` file there, is not seen), pip
told to use no index and a proxy that refuses every connection. The GPU
machine runs Python 3.12 and torch 2.11; the environment here is built on
the interpreter running the tests, the one that has torch (a Python 3.12
here has no torch, and no network reaches a torch 2.11 CPU build).

The check must install commrt from the copy without downloading anything,
run every step it can, and say of each GPU step that it did not run because
there is no CUDA GPU, with exit status 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import gpu_check as G  # tools/ is on sys.path (tests/conftest.py)
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _copy_tree(dst: str) -> None:
    """The files git tracks or would track (not ignored), as the copy sent to a GPU machine."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, (p.decode() for p in listed)):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))


def _offline_env(venv: str) -> dict:
    """A virtual environment without commrt that sees the installed packages (a plain path
    entry: the site folder's .pth files, this checkout's editable commrt among them, are
    not run), and an environment in which nothing can be downloaded."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    site = subprocess.run(
        [
            os.path.join(venv, "bin", "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with open(os.path.join(site, "installed_packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    refuse = "http://127.0.0.1:9"  # the discard port: every download fails at once
    env.update(PIP_NO_INDEX="1", HTTP_PROXY=refuse, HTTPS_PROXY=refuse, http_proxy=refuse)
    env.update(https_proxy=refuse, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _where(python: str, env: dict, cwd: str) -> str:
    proc = subprocess.run(
        [python, "-c", "import commrt.kernels as k; print(k.__file__)"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the check runs for real")
@pytest.mark.slow
def test_the_check_runs_offline_from_a_copy_and_says_why_it_stops(tmp_path):
    tree, venv, out = str(tmp_path / "tree"), str(tmp_path / "venv"), str(tmp_path / "out")
    _copy_tree(tree)
    env = _offline_env(venv)
    python = os.path.join(venv, "bin", "python")
    assert "No module named 'commrt'" in _where(python, env, str(tmp_path))  # not installed

    # the path-based import first: nothing installed, links under --out
    probe = (
        "import sys; sys.path.insert(0, 'tools'); import gpu_check as G; "
        f"s = G.Steps({out!r}, 120); print(G.import_step(s, 'path')); "
        "import json; print(json.dumps(s.env()))"
    )
    proc = subprocess.run([python, "-c", probe], cwd=tree, env=env, capture_output=True, text=True)
    assert "passed    path-based" in proc.stdout, proc.stdout + proc.stderr
    linked = json.loads(proc.stdout.splitlines()[-1])
    assert _where(python, linked, tree) == os.path.join(
        out, "gpu_check_import", "commrt", "kernels", "__init__.py"
    )
    assert "No module named 'commrt'" in _where(python, env, str(tmp_path))  # still nothing

    # the whole check: pip installs from the copy, offline; every GPU step says why it stops
    out = str(tmp_path / "back")  # what the lent machine gives back: at most 8 files
    proc = subprocess.run(
        [python, "tools/gpu_check.py", "--out", out],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    table = proc.stdout.splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert all(len(line) <= 80 for line in table), [ln for ln in table if len(ln) > 80]
    rows = {ln[:34].rstrip(): ln[35:] for ln in table}
    assert rows["import commrt"].startswith("passed    pip -e, offline, no build isolation"), table
    for step in (
        "kernels vs torch on CUDA",
        "CUDA IPC smoke",
        "GradientSync bf16 wire",
        "kernel benchmark (CUDA cases)",
        "GPU hot path (CUDA cases)",
        "kernel GB/s vs copy_",
        "GPU tests",
        'DDP "commrt" vs NCCL, world of 1',
        # the multi-rank steps: several ranks on the one GPU over cuda_ipc
        "cuda_ipc collectives, 2 ranks",
        "cuda_ipc collectives, 4 ranks",
        "GradientSync 1 GPU, 4 ranks",
        "DDP, FSDP2 on cuda:commrt, 2 ranks",
        "stall verdict, 4 GPU ranks",
    ):
        assert rows[step].startswith("NOT RUN   no CUDA GPU"), (step, table)
    for name in ("test_bf16_wire_dtype", "test_a_communicator_timeout", "test_nccl_world_of"):
        (case,) = [v for k, v in rows.items() if k.startswith(name)]  # a row per GPU test
        assert case.startswith("skipped   no CUDA GPU"), (name, case)
    backup = [v for k, v in rows.items() if k.startswith("test_gradient_sync_backup")]
    assert backup and all(v.startswith("skipped") for v in backup), table  # (names cut alike)
    assert rows["test_kernels_compile_for_sm90"].startswith("passed"), table
    assert rows["CUDA graph replay per bucket"].startswith("not built"), table
    assert rows["result"].startswith("NOT RUN   exit 2"), table
    assert set(os.listdir(out)) <= set(G.OUT_FILES) and len(G.OUT_FILES) <= 8, os.listdir(out)
    with tarfile.open(os.path.join(out, G.LOGS_ARCHIVE)) as tar:
        logs = tar.getnames()
    assert "gpu_check_logs/gpu_check_test_gpu_ranks.txt" in logs, logs
    print(proc.stdout)  # the table, for -s
    assert _where(python, env, str(tmp_path)) == os.path.join(tree, "kernels", "__init__.py")
