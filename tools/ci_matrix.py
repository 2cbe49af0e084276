"""CI's steps beyond the suite: the wheel as users install it, and the torch matrix.

.ci/run calls this after the suite; ``.ci/matrix.toml`` declares what it runs::

    python tools/ci_matrix.py all       # CI: the wheel, then each CI row (below)
    python tools/ci_matrix.py prepare   # every venv below, made ahead, nothing run
    python tools/ci_matrix.py wheel     # build, install non-editable, use it
    python tools/ci_matrix.py torch     # the torch-facing tests on each CI row of the matrix
    python tools/ci_matrix.py torch --only 2.15.0   # one row, a by-hand one (ci = false) too

``wheel``: a wheel and an sdist built from this tree (``python -m build``;
the wheel is built from the sdist, so both are checked); the wheel must hold
every module of the tree. It is installed, non-editable, in a fresh venv
beside the matrix's torch, and used from a folder outside the tree: every
``commrt`` module imports (a module whose only missing import is an optional
extra's, Triton's, CuPy's or mpi4py's, is named as such), ``commrt --help``
answers, a 2-rank ``commrt bench allreduce`` runs, and a 2-rank DDP step on
backend ``"commrt"`` under torchrun gives the average of both ranks'
gradients on both ranks.

``torch``: for each ``[[torch_facing.run]]`` with ``ci = true`` (or the
one ``--only`` names), a fresh venv with that Python and torch, commrt
installed editable with its ``test`` extra, and the ``torch_facing.tests``
run there with ``torch_facing.pytest``'s options. A row with ``wheel = true``
(the wheel's Python, torch and build) makes no venv of its own: its tests run
in the wheel's venv, against the wheel installed non-editable (its ``test``
extra added), so one CUDA build of torch serves both. Every row's tests run
from a folder outside the tree, so that the tree's ``commrt/`` is never on
``sys.path`` (neither pytest's nor that of a ``python -m commrt`` a test
starts). pip's cap on torch on these machines (``/etc/xdg/pip``) is lifted
for these venvs alone (``PIP_CONSTRAINT``): each pins its torch itself.

``all`` runs ``wheel`` and then ``torch``, making each venv while the one
before it is used (``prepare --only``, in a second process whose output is
shown when its venv is needed): one install at a time, beside a few minutes
of tests, and never beside the suite. Each venv holds a CUDA build of torch
(about 5 GB written, and the page cache that every rank's import of torch
reads from flushed with it), which is why CI makes them after the suite and
not during it. At most two venvs exist at once: the one in use and the next.

Every step prints its time; the first failure ends the run with exit 1.
The venvs live in one folder, ``COMMRT_CI_DIR`` (default
``$TMPDIR/commrt-ci``); a venv is removed once it has been used, and the
whole folder once ``torch`` or ``all`` is done.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / ".ci" / "matrix.toml"
#: top-level modules of optional extras: a module that needs one of them and finds it
#: missing is named, not failed (the wheel step installs the core package and `train`)
OPTIONAL = {"triton": "cuda12/cuda13", "cupy": "cuda12/cuda13", "mpi4py": "mpi"}

_IMPORT_ALL = r"""
import importlib, pkgutil, sys, commrt
optional = dict(arg.split("=") for arg in sys.argv[1:])
count, needs, failed = 0, [], []
for m in pkgutil.walk_packages(commrt.__path__, "commrt."):
    if m.name.endswith(".__main__"):  # runs the command line
        continue
    count += 1
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        (needs if root in optional else failed).append(f"{m.name}: {e}")
    except Exception as e:
        failed.append(f"{m.name}: {type(e).__name__}: {e}")
print(f"imported {count - len(needs) - len(failed)} of {count} modules from {commrt.__file__}")
for line in needs:
    print(f"  needs an extra: {line}")
for line in failed:
    print(f"  FAILED: {line}")
sys.exit(1 if failed or count < 100 else 0)
"""

_DDP_STEP = r"""
import copy, os, torch, commrt, torch.distributed as dist
dist.init_process_group("commrt")
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
local = torch.nn.Linear(16, 4)
inputs = [torch.randn(8, 16, generator=torch.Generator().manual_seed(r)) for r in range(size)]
grads = []
for x in inputs:  # every rank's gradient, here: their average is what DDP must give
    m = copy.deepcopy(local)
    m(x).square().sum().backward()
    grads.append(m.weight.grad)
model = torch.nn.parallel.DistributedDataParallel(local)
model(inputs[rank]).square().sum().backward()
want = torch.stack(grads).double().mean(0).float()
assert torch.allclose(model.module.weight.grad, want, rtol=1e-6, atol=1e-6), "not the average"
assert dist.get_backend() == "commrt"
print(f"rank {rank}: a DDP step on commrt gave the average of {size} ranks' gradients")
dist.destroy_process_group()
"""


class Failed(Exception):
    """A step failed; the message says which and why."""


def step(what: str, cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    """Run ``cmd``, print its time and output's tail; raise :class:`Failed` on non-zero."""
    start = time.monotonic()
    shown = " ".join(" ".join(cmd).split())  # a -c script on one line
    print(f"--- {what}: {shown if len(shown) <= 150 else shown[:149] + '…'}", flush=True)
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    took = time.monotonic() - start
    # a failure's cause sits above pytest's slowest-tests list and summary: show more of it
    tail = "\n".join(proc.stdout.strip().splitlines()[-25 if proc.returncode == 0 else -150 :])
    if tail:
        print(tail, flush=True)
    print(f"--- {what}: {'ok' if proc.returncode == 0 else 'FAILED'} in {took:.0f} s", flush=True)
    if proc.returncode != 0:
        raise Failed(f"{what} exited {proc.returncode}")
    return proc.stdout


def interpreter(version: str) -> str:
    """A Python ``version`` ("3.12") interpreter: this one, one on PATH, or pyenv's."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = [shutil.which(f"python{version}")]
    found += sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in filter(None, found):
        probe = [candidate, "-c", "import sys; print(sys.version_info[:2])"]
        if subprocess.run(probe, capture_output=True, text=True).stdout.strip() == str(
            tuple(int(p) for p in version.split("."))
        ):
            return candidate
    raise Failed(f"no Python {version} here (on PATH or under {root}/versions)")


def venv_env(where: Path) -> dict:
    """The environment for the venv at ``where``: it first on PATH, and pip's torch cap
    left out (each venv pins its own torch)."""
    env = dict(os.environ, PATH=f"{where / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env.update(VIRTUAL_ENV=str(where), PIP_CONSTRAINT=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    return env


def made(where: Path, python: str, installs) -> tuple[Path, dict]:
    """The venv at ``where`` with ``installs(pip, env)`` done: made now, or found made by an
    earlier ``prepare`` (its ``.ready`` file). Returns its bin folder and environment."""
    ready = where / ".ready"
    env = venv_env(where)
    if not ready.exists():
        shutil.rmtree(where, ignore_errors=True)
        step(f"venv (Python {python})", [interpreter(python), "-m", "venv", str(where)])
        installs([str(where / "bin" / "python"), "-m", "pip", "install", "-q"], env)
        ready.touch()
    return where / "bin", env


def tree_modules(root: Path = ROOT) -> set[str]:
    """Every library file of the tree at ``root`` as the path it has in a wheel
    (``commrt/kernels/pack.py``), by that tree's package-dir."""
    mapped = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))
    found = set()
    for package, folder in mapped["tool"]["setuptools"]["package-dir"].items():
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root / folder).as_posix()
            found.add(f"{package.replace('.', '/')}/{rel}")
    return found


def built_wheel(work: Path, python: str, env: dict) -> Path:
    """The wheel (and an sdist) built from this tree into ``work/dist`` by ``python`` (a
    venv's, which has ``build``), once; it must hold every module of the tree."""
    dist = work / "dist"
    found = list(dist.glob("commrt-*.whl"))
    if not found:
        build = [python, "-m", "build", "-o", str(dist), str(ROOT)]
        step("build a wheel and an sdist", build, env=env)
        found = list(dist.glob("commrt-*.whl"))
    (whl,) = found
    (sdist,) = dist.glob("commrt-*.tar.gz")
    held = {n for n in zipfile.ZipFile(whl).namelist() if n.endswith(".py")}
    missing = sorted(tree_modules() - held)
    if missing:
        raise Failed(f"{whl.name} lacks {len(missing)} modules of the tree: {missing[:8]}")
    print(f"{whl.name} holds all {len(held)} modules of the tree; sdist {sdist.name}")
    return whl


def wheel_venv(matrix: dict, work: Path) -> tuple[Path, dict]:
    """The wheel's venv: the matrix's torch, then the wheel (built now), non-editable."""
    spec = matrix["wheel"]

    def installs(pip, env):
        step(f"install torch {spec['torch']}", [*pip, f"torch=={spec['torch']}"], env=env)
        step("install build", [*pip, "build"], env=env)
        whl = built_wheel(work, pip[0], env)
        step("install the wheel", [*pip, f"commrt[train] @ {whl.as_uri()}"], env=env)

    return made(work / "venv-wheel", spec["python"], installs)


def wheel(matrix: dict, work: Path) -> None:
    """Use the installed wheel from outside the tree (module docs)."""
    bin_, env = wheel_venv(matrix, work)
    away = Path(tempfile.mkdtemp(prefix="elsewhere-", dir=work))  # no tree on sys.path
    python = str(bin_ / "python")
    optional = [f"{k}={v}" for k, v in OPTIONAL.items()]
    step("import every module", [python, "-c", _IMPORT_ALL, *optional], away, env)
    step("commrt --help", [str(bin_ / "commrt"), "--help"], away, env)
    bench = [str(bin_ / "commrt"), "bench", "allreduce", "--nproc", "2", "--sizes", "8,64K"]
    step("2-rank bench", [*bench, "--repeats", "2", "--algorithms", "ring,auto"], away, env)
    (away / "ddp_step.py").write_text(_DDP_STEP)
    run = [str(bin_ / "torchrun"), "--standalone", "--nproc-per-node", "2", "ddp_step.py"]
    out = step("2-rank DDP step on commrt under torchrun", run, away, env)
    if out.count("gave the average of 2 ranks' gradients") != 2:
        raise Failed("the DDP step did not report from both ranks")


def row_venv(matrix: dict, row: dict, work: Path) -> tuple[Path, dict]:
    """A torch row's venv: its torch, then commrt editable with the ``test`` extra; for a
    row run in the wheel's venv, that venv with the wheel's ``test`` extra added."""
    if row.get("wheel"):
        bin_, env = wheel_venv(matrix, work)
        whl = built_wheel(work, str(bin_ / "python"), env)  # built already: found, checked
        pip = [str(bin_ / "python"), "-m", "pip", "install", "-q"]
        step("install the wheel's test extra", [*pip, f"commrt[test] @ {whl.as_uri()}"], env=env)
        return bin_, env

    def installs(pip, env):
        step(f"install torch {row['torch']}", [*pip, f"torch=={row['torch']}"], env=env)
        step("install commrt[test] (editable)", [*pip, "-e", f"{ROOT}[test]"], env=env)

    return made(work / f"venv-torch-{row['torch']}", row["python"], installs)


def torch_row(matrix: dict, row: dict, work: Path) -> None:
    """The torch-facing tests on one (Python, torch) of the matrix (module docs)."""
    bin_, env = row_venv(matrix, row, work)
    # run from a folder outside the tree, so that neither pytest nor the `python -m commrt`
    # a test starts finds the tree's commrt/ on sys.path: a row in the wheel's venv tests the
    # installed wheel, and the check below sees what the tests import
    away = Path(tempfile.mkdtemp(prefix="elsewhere-", dir=work))
    python = [str(bin_ / "python")]
    where = "import commrt, torch; print(torch.__version__, commrt.__file__)"
    out = step("torch, and commrt as the tests import it", [*python, "-c", where], away, env)
    got, found = out.strip().splitlines()[-1].split(" ", 1)
    if not got.startswith(row["torch"]):
        raise Failed(f"asked for torch {row['torch']}, got {got}")
    if row.get("wheel") and not Path(found).is_relative_to(bin_.parent):
        raise Failed(f"the tests would import commrt from {found}, not the installed wheel")
    facing = matrix["torch_facing"]
    tests = [*python, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    tests += [*facing["pytest"], *(str(ROOT / path) for path in facing["tests"])]
    step(f"torch-facing tests on torch {row['torch']}", tests, away, env)
    shutil.rmtree(bin_.parent)


class Ahead:
    """A venv being made in a second process (``prepare --only``) while this one works.

    ``ready()`` waits for it and shows its output; a failure there is raised as that
    venv's :class:`Failed`, so the step that needed it is the one that fails.
    """

    def __init__(self, what: str, work: Path):
        self.what = what
        self.log = tempfile.TemporaryFile("w+")
        me = [sys.executable, str(Path(__file__).resolve()), "prepare", "--only", what]
        env = dict(os.environ, COMMRT_CI_DIR=str(work))
        self.proc = subprocess.Popen(me, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.start = time.monotonic()

    def ready(self) -> None:
        code = self.proc.wait()
        self.log.seek(0)
        print(self.log.read().rstrip(), flush=True)
        took = time.monotonic() - self.start
        print(f"--- the {self.what} venv, made ahead: ready after {took:.0f} s", flush=True)
        if code != 0:
            raise Failed(f"making the {self.what} venv ahead exited {code}")


def pipelined(matrix: dict, rows: list[dict], work: Path) -> None:
    """``wheel`` (and the rows run in its venv) and then each other row's tests, the next
    venv made while one is used."""
    own = [row for row in rows if not row.get("wheel")]
    order = ["wheel", *(row["torch"] for row in own)]
    ahead = Ahead(order[0], work)
    for i, what in enumerate(order):
        ahead.ready()
        ahead = Ahead(order[i + 1], work) if i + 1 < len(order) else None
        try:
            if what == "wheel":
                wheel(matrix, work)
                for row in rows:
                    if row.get("wheel"):
                        torch_row(matrix, row, work)
                shutil.rmtree(work / "venv-wheel", ignore_errors=True)
            else:
                torch_row(matrix, own[i - 1], work)
        except Failed:
            if ahead is not None:
                ahead.proc.kill()
                ahead.proc.wait()
            raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", choices=("prepare", "wheel", "torch", "all"))
    parser.add_argument(
        "--only",
        metavar="TORCH",
        help="the torch rows of this version alone (with prepare, also 'wheel': its venv alone)",
    )
    args = parser.parse_args(argv)
    matrix = tomllib.loads(MATRIX.read_text("utf-8"))
    rows = [
        r
        for r in matrix["torch_facing"]["run"]
        if (args.only is None and r["ci"]) or args.only == r["torch"]
    ]
    just_wheel = args.what == "prepare" and args.only == "wheel"
    if args.only and not rows and not just_wheel:
        parser.error(f"--only {args.only}: .ci/matrix.toml has no such torch row")
    work = Path(os.environ.get("COMMRT_CI_DIR") or Path(tempfile.gettempdir()) / "commrt-ci")
    start = time.monotonic()
    try:
        if args.what == "prepare":
            if args.only is None:
                shutil.rmtree(work, ignore_errors=True)
            if args.only in (None, "wheel"):
                wheel_venv(matrix, work)
            for row in rows:
                if not row.get("wheel"):
                    row_venv(matrix, row, work)
        if args.what == "all":
            shutil.rmtree(work, ignore_errors=True)
            pipelined(matrix, rows, work)
        if args.what == "wheel":
            wheel(matrix, work)
        if args.what == "torch":
            for row in rows:
                torch_row(matrix, row, work)
    except Failed as e:
        print(f"ci_matrix: {e}", file=sys.stderr)
        return 1
    finally:
        if args.what in ("torch", "all"):
            shutil.rmtree(work, ignore_errors=True)
    print(f"ci_matrix: {args.what} passed in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
