"""One command for the day a GPU is lent: import, every GPU test, the kernel benchmark, one table.

From a copy of the working tree, on the GPU machine, with no network::

    python3 tools/gpu_check.py            # logs under $OUT where it is set, else out/gpu_check

It downloads nothing: torch, Triton, cupy (the cupy-cudaNNx of torch's
CUDA), NCCL, pytest and pytest-benchmark must be installed already. It
finishes within ``--budget`` seconds (420, 7 minutes: with the machine's
start and the transfers, a second run after a fix fits in the same
15-minute lease): a step still running then is killed and reported as
such. The GPU tests come first: a short budget leaves the benchmark steps
what the tests do not use. Each step runs in a child process of its own
session (killed as a group: no rank of a step runs on into the next) with
``TRITON_INTERPRET`` removed. Each row is written to ``summary.txt`` under
``--out`` as soon as it is known; every log (each test file's, every rank
job's output under ``ranks/``: a hung rank's ends in its Python stacks)
goes to ``--logs`` (a new temporary folder unless named), packed into
``--out``'s ``gpu_check_logs.tar.gz`` after every step, so that a run cut
short still leaves its evidence. ``--out`` holds only :data:`OUT_FILES`
(the lent GPU machine gives back at most 8 files):

1. what is installed: Python, torch and its CUDA, the GPU, Triton, cupy,
   NCCL, and whether the cupy matches ``torch.version.cuda`` (the extra to
   install is ``commrt[cudaNN]`` for torch's CUDA major NN, not the
   driver's);
2. import commrt from this tree: as it is, if ``commrt``,
   ``commrt.kernels`` and ``commrt.algorithms`` already import from here;
   else ``pip install --no-build-isolation --no-deps --no-index -e .``
   (offline; the build uses the installed setuptools); if that fails, a
   path-based import that needs nothing installed: a folder of links under
   ``--logs`` that maps ``kernels/`` and ``algorithms/`` to
   ``commrt.kernels`` and ``commrt.algorithms`` (``package-dir`` does that
   for an install), first on every child's ``PYTHONPATH``; then one child
   compiles the kernels (each wire dtype, a few sizes), so that the ranks of
   the next step load them from Triton's cache rather than all compiling at
   once within their limit; then the IPC smoke: a slab and an event exported
   here and used by another process within 20 s, through the ``cuda_ipc``
   transport's own device calls, with the GPU's compute mode; where CUDA
   IPC is refused (a sandbox may), the multi-rank files
   (:data:`IPC_FILES`) do not run and each of their checks says NOT RUN
   with the reason;
3. every file of tests/gpu/ at once, each in its own pytest (one GPU is
   plenty for them together), one row per test: passed, FAILED (the first
   line of the error), skipped (the reason) or killed; a pytest that
   crashed (a segfault, a CUDA abort) is FAILED with its log's tail, whatever
   passed before; among them DDP on backend ``"commrt"`` on one rank with CUDA tensors against NCCL's own
   backend, and GradientSync with a bf16 wire; and the multi-rank steps
   (tests/gpu/test_gpu_ranks*.py): 2 and 4 ranks on the one GPU over
   ``cuda_ipc`` (NCCL refuses two ranks on one device): collectives with
   ring, halving-doubling and torus2d; GradientSync with ring, torus2d,
   gossip (plain and with a deadline) and backup workers, fp32 and a bf16
   wire, with overlap in its trace; DDP and FSDP2 on ``cuda:commrt``; the
   stall verdict for a rank stuck in user code;
4. the CUDA cases of ``bench/bench_kernels.py`` (its tables go to
   ``gpu_check_bench.txt``), alone on the GPU: GB/s on a cold cache against
   ``copy_``, and the host's µs per call apart;
5. the hot path, ``bench/bench_hotpath_gpu.py`` (its tables go to
   ``gpu_check_hotpath.txt``): host µs per call of pack, unpack and
   ``reduce_``, the executor's time per step over ``cuda_ipc`` (2 ranks on
   the GPU), and a ResNet-50 step at one rank with GradientSync and with DDP
   on ``"commrt"`` against a plain step and DDP on ``"nccl"``; a row says
   what is not built yet (a bucket replayed as a CUDA graph);
6. pack, unpack (fp32 and bf16 wire) and the receive-reduce at 1 MB to
   1 GiB buckets, GB/s (bytes read + written) against ``Tensor.copy_`` of
   the same elements, each timed over many back-to-back launches between
   two CUDA events.

It prints one table, at most 80 columns wide. A step that ran nothing on
the GPU says NOT RUN and why, never passed: the GPU tests when no test
marked ``gpu`` ran, the benchmark when not every CUDA case ran (pytest
exits 0 when they all skip), and each of the checks the GPU run is for
(listed in :data:`REQUIRED`) when its test skipped or is missing.

Exit status: 0 when every step ran on the GPU and passed; 1 when any step
failed or was killed; 2 when nothing failed but a step did not run (on a
machine without a GPU, the steps that need one say "no CUDA GPU" and the
status is 2).

The module is also the pytest plugin the steps load (``-p gpu_check``): it
writes each test's outcome, skip reason or error, and ``gpu`` mark to the
file named by ``COMMRT_GPU_CHECK_RESULTS``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")
WIDTH = 80
MB = 1 << 20
#: the file the plugin half of this module appends test outcomes to (JSON lines)
RESULTS_ENV = "COMMRT_GPU_CHECK_RESULTS"
#: GradientSync's ring, torus2d and gossip, fp32 and bf16 wire, and overlap in its trace
SYNC = "test_gradient_sync_ring_torus2d_gossip_fp32_bf16_with_overlap"
#: the checks the GPU run is for, each shown by one test; skipped or missing = NOT RUN
ONE_RANK = {
    "kernels vs torch on CUDA": "test_triton_on_cuda_matches_torch_and_float64",
    "NCCL, world of 1": "test_nccl_world_of_one_on_gpu",
    'DDP "commrt" vs NCCL, world of 1': "test_ddp_on_commrt_matches_nccl_on_one_gpu",
    "GradientSync bf16 wire": "test_bf16_wire_dtype_through_the_compiled_kernels",
}
#: the test files that run several ranks on the one GPU over cuda_ipc: not run where the
#: IPC smoke step (step 2) finds CUDA IPC refused
IPC_FILES = ("test_gpu_ranks.py", "test_gpu_ranks_sync.py", "test_gpu_ranks_torch.py")
#: the checks of those files
IPC_RANKS = {
    "cuda_ipc collectives, 2 ranks": "test_collectives_on_one_gpu_over_cuda_ipc[2]",
    "cuda_ipc collectives, 4 ranks": "test_collectives_on_one_gpu_over_cuda_ipc[4]",
    "GradientSync 1 GPU, 2 ranks": SYNC + "[2 ranks]",
    "GradientSync 1 GPU, 4 ranks": SYNC + "[4 ranks]",
    "gossip deadline 1 GPU, 2 ranks": "test_gradient_sync_gossip_with_a_deadline[2 ranks]",
    "backup workers 1 GPU, 2 ranks": "test_gradient_sync_backup_workers[2 ranks]",
    "DDP, FSDP2 on cuda:commrt, 2 ranks": "test_ddp_and_fsdp2_on_cuda_commrt_at_two_ranks_on_one_gpu",
    "stall verdict, 4 GPU ranks": "test_stall_verdict_names_a_gpu_rank_stuck_in_user_code",
}
REQUIRED = {**ONE_RANK, **IPC_RANKS}
PASSED, FAILED, NOT_RUN, KILLED = "passed", "FAILED", "NOT RUN", "killed"
#: seconds the steps may take at most (the rest of the budget permitting), in the order they
#: run, which is their order of importance; the tests' limit holds a rank job's (90 s, where
#: a hung one is dumped and killed) twice over; the benchmarks' leave each a turn in the
#: default budget after GPU tests of a few minutes
LIMITS = {
    "probe": 60, "import": 120, "warmup": 60, "ipc": 30, "tests": 210, "bench": 90,
    "hotpath": 90, "kernels": 60,
}  # fmt: skip
#: seconds the IPC smoke's other process has to open, wait and answer
IPC_PEER_S = 20
#: the whole check's default budget (seconds): see the module docs
BUDGET_S = 420
#: the file under --out that holds the table's rows as soon as each is known
SUMMARY = "summary.txt"
#: where every rank job's output is saved (the tests' helpers.mp.LOGS_ENV), under --logs
RANK_LOGS_ENV, RANK_LOGS = "COMMRT_TEST_LOGS", "ranks"
#: the archive of --logs under --out, rewritten after every step
LOGS_ARCHIVE = "gpu_check_logs.tar.gz"
#: every file --out holds: the rows, the two benchmarks' tables, the logs' archive
OUT_FILES = (SUMMARY, "gpu_check_bench.txt", "gpu_check_hotpath.txt", LOGS_ARCHIVE)
#: lines of a crashed pytest's log shown in its row's file
CRASH_TAIL = 40
#: the hot path's measurements that have nothing to run yet: (row, why)
NOT_BUILT = {"CUDA graph replay per bucket": "the library captures no CUDA graphs yet"}
#: what a row of :data:`NOT_BUILT` says in its result column (not a failure, not a skip)
ABSENT = "not built"
#: a step left fewer seconds than this is not started
MIN_STEP = 5


# ------------------------------------------------------------ the table


def _cut(text: str, n: int, squash: bool = True) -> str:
    text = " ".join(str(text).split()) if squash else str(text).rstrip()
    return text if len(text) <= n else text[: n - 1] + "…"


def row(name: str, result: str, detail: str = "") -> str:
    """One line of the table: name (34), result (9), detail (the rest), within 80 columns."""
    line = f"{_cut(name, 34):<34} {_cut(result, 9):<9} {_cut(detail, WIDTH)}"
    return _cut(line, WIDTH, squash=False)


def result_of(line: str) -> str:
    """The result column of a :func:`row`."""
    return line[35:44].strip()


def exit_status(results: list[str]) -> int:
    """1 if any step failed or was killed, else 2 if any did not run, else 0."""
    if any(r in (FAILED, KILLED) for r in results):
        return 1
    return 2 if NOT_RUN in results else 0


# ------------------------------------------------------------ the plugin half (in pytest)


def _message(report) -> str:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        return str(reason).removeprefix("Skipped: ")
    text = getattr(report, "longreprtext", "") or ""
    errors = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (errors or lines or ["(no message)"])[0]


#: nodeids of the collected tests marked ``gpu`` (a report's keywords also hold the names
#: of its folders, tests/gpu/ among them, so the mark is read from the items)
_GPU_MARKED: set[str] = set()


def pytest_collection_modifyitems(items) -> None:
    """(pytest hook) Note which tests carry the ``gpu`` mark."""
    _GPU_MARKED.update(i.nodeid for i in items if i.get_closest_marker("gpu") is not None)


def _record(report, when: str) -> None:
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    rec = {
        "nodeid": report.nodeid,
        "when": when,
        "outcome": report.outcome,
        "gpu": report.nodeid in _GPU_MARKED,
        "seconds": round(getattr(report, "duration", 0.0) or 0.0, 2),
        "message": "" if report.passed else _message(report),
    }
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def pytest_runtest_logreport(report) -> None:
    """(pytest hook) The call's outcome, and a setup or teardown that did not pass."""
    if report.when == "call" or not report.passed:
        _record(report, report.when)


def pytest_collectreport(report) -> None:
    """(pytest hook) A file that failed to import is a failure, not an empty step."""
    if report.failed:
        _record(report, "collect")


def read_results(path: str) -> dict[str, dict]:
    """Per test (nodeid, in order): outcome passed / failed / skipped, gpu mark, seconds,
    message. A failed setup, call or teardown, or a failed collection, makes it failed."""
    tests: dict[str, dict] = {}
    if not os.path.exists(path):
        return tests
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            t = tests.setdefault(rec["nodeid"], dict(rec, outcome="passed", message=""))
            t["gpu"] = t["gpu"] or rec["gpu"]
            if rec["when"] == "call":
                t["seconds"] = rec["seconds"]
            if rec["outcome"] != "passed" and t["outcome"] != "failed":
                t["outcome"], t["message"] = rec["outcome"], rec["message"]
    return tests


def case_rows(tests: dict[str, dict]) -> list[str]:
    """One row per test: its name, passed (seconds), FAILED, skipped (the reason)."""
    out = []
    for nodeid, t in tests.items():
        name = nodeid.split("::")[-1]
        if t["outcome"] == "failed":
            out.append(row(name, FAILED, t["message"]))
        elif t["outcome"] == "skipped":
            out.append(row(name, "skipped", t["message"]))
        else:
            out.append(row(name, PASSED, f"{t['seconds']:.1f} s"))
    return out


def tests_result(tests: dict[str, dict]) -> tuple[str, str]:
    """(result, detail) of the GPU tests as a whole, none of them cut by the budget."""
    failed = [t for t in tests.values() if t["outcome"] == "failed"]
    ran = [t for t in tests.values() if t["gpu"] and t["outcome"] == "passed"]
    skipped = [t for t in tests.values() if t["outcome"] == "skipped"]
    if failed:
        return FAILED, f"{len(failed)} failed, {len(ran)} ran on the GPU"
    if not ran:
        reasons = Counter(t["message"] for t in skipped if t["gpu"]).most_common()
        return NOT_RUN, "; ".join(r for r, _ in reasons) or "no test marked gpu was found"
    return PASSED, f"{len(ran)} ran on the GPU, {len(skipped)} skipped"


def required_rows(tests: dict[str, dict], ipc_refused: str | None = None):
    """A row per check of :data:`REQUIRED`: passed or FAILED as its test, NOT RUN when the
    test skipped or did not run at all (``ipc_refused``: why the checks of
    :data:`IPC_RANKS` did not). Returns (rows, results)."""
    by_name = {nodeid.split("::")[-1]: t for nodeid, t in tests.items()}
    rows, results = [], []
    for label, name in REQUIRED.items():
        t = by_name.get(name)
        if t is None and ipc_refused and label in IPC_RANKS:
            result, detail = NOT_RUN, ipc_refused
        elif t is None:
            result, detail = NOT_RUN, f"its test did not run: {name}"
        elif t["outcome"] == "failed":
            result, detail = FAILED, t["message"]
        elif t["outcome"] == "skipped":
            result, detail = NOT_RUN, t["message"]
        else:
            result, detail = PASSED, name
        rows.append(row(label, result, detail))
        results.append(result)
    return rows, results


def bench_result(tests: dict[str, dict], log: str = "gpu_check_bench.txt") -> tuple[str, str]:
    """(result, detail) of a benchmark (its log: ``log``): passed only when every CUDA
    case ran."""
    cuda = [t for t in tests.values() if t["gpu"]]
    ran = [t for t in cuda if t["outcome"] == "passed"]
    failed = [t for t in tests.values() if t["outcome"] == "failed"]
    if failed:
        return FAILED, failed[0]["message"]
    if not cuda:
        return NOT_RUN, "no CUDA case was collected"
    if len(ran) < len(cuda):
        reasons = sorted({t["message"] for t in cuda if t["outcome"] == "skipped"})
        return NOT_RUN, "; ".join(reasons + [f"{len(ran)} of {len(cuda)} CUDA cases ran"])
    return PASSED, f"{len(ran)} CUDA cases; tables in {log}"


# ------------------------------------------------------------ children


class Steps:
    """The environment every child starts with, the time left to them, and where their
    files go: tables under ``out``, logs under ``logs`` (``out`` itself unless named)."""

    def __init__(self, out: str, budget: float, logs: str | None = None):
        self.out, self.logs = out, logs or out
        self.deadline = time.monotonic() + budget
        self.extra: dict[str, str] = {}  # what the import step added (path-based import)
        self.given: dict[str, float] = {}  # seconds each step was given

    def env(self, **more) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.extra, **more)
        env.pop("TRITON_INTERPRET", None)
        # a child pytest is a session of its own: run from a pytest-xdist worker (the suite's
        # own test of this check), the worker's variables made pytest-benchmark think xdist
        # ran it, and refuse --benchmark-only
        for name in [n for n in env if n.startswith("PYTEST_XDIST_")]:
            del env[name]
        paths = [p for p in (self.extra.get("PYTHONPATH"), TOOLS) if p]
        rest = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(paths + ([rest] if rest else []))
        return env

    def pack(self) -> None:
        """Write ``logs`` (but the import's links) to :data:`LOGS_ARCHIVE` under ``out``,
        replacing the last one whole: a run cut short leaves a readable archive."""
        if os.path.abspath(self.logs) == os.path.abspath(self.out):
            return
        path = os.path.join(self.out, LOGS_ARCHIVE)
        with tarfile.open(path + ".part", "w:gz") as tar:
            tar.add(self.logs, arcname="gpu_check_logs",
                    filter=lambda t: None if LINKS in t.name.split("/") else t)  # fmt: skip
        os.replace(path + ".part", path)

    def limit(self, step: str) -> float:
        """Seconds ``step`` may run: its own limit, or what is left of the budget if less.
        The steps run in order of importance (the GPU tests before the benchmark), so a
        short budget goes to the first ones."""
        self.given[step] = min(LIMITS[step], self.deadline - time.monotonic())
        return self.given[step]

    def cut(self, step: str) -> tuple[str, str]:
        """(result, detail) of ``step`` stopped by the budget: killed at its limit, or not
        run at all when the steps before it left it less than :data:`MIN_STEP` seconds."""
        if self.given[step] < MIN_STEP:
            return NOT_RUN, "no time left: raise --budget"
        return KILLED, f"after {self.given[step]:.0f} s: raise --budget"

    def run(self, cmd: list[str], step: str, **env):
        """(return code or None if killed at its limit, output) of a child in ROOT, in a
        session of its own: at its limit the whole group is killed (a benchmark's ranks
        too), and what it printed until then is kept."""
        limit = self.limit(step)
        if limit < MIN_STEP:
            return None, f"out of time: {limit:.0f} s of the budget left"
        proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env(**env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        try:
            out = proc.communicate(timeout=limit)[0]
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return None, proc.communicate()[0]


# ------------------------------------------------------------ 1. what is installed

_PROBE = r"""
import importlib.metadata as md, json, sys
def ver(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
out = {"python": sys.version.split()[0], "triton": ver("triton"), "pytest": ver("pytest"),
       "pytest_benchmark": ver("pytest-benchmark"),
       "cupy": {d: ver(d) for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if ver(d)}}
try:
    import torch
    out["torch"], out["torch_cuda"] = torch.__version__, torch.version.cuda
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["gpus"] = torch.cuda.device_count()
except Exception as e:
    out["torch_error"] = repr(e)
try:
    from cupy.cuda import nccl
    v = nccl.get_version()
    out["nccl"] = f"{v // 10000}.{v // 100 % 100}.{v % 100}"
except Exception as e:
    out["nccl_error"] = type(e).__name__
print(json.dumps(out))
"""


def cuda_extra(torch_cuda: str | None) -> str | None:
    """The extra for torch's CUDA (``torch.version.cuda``, e.g. "13.0" -> "cuda13"): cupy
    and NCCL must be built for the CUDA torch was built for, whatever the driver supports
    (a CUDA 13 driver runs CUDA 12 builds too). None for a CPU build of torch."""
    if not torch_cuda:
        return None
    return f"cuda{str(torch_cuda).split('.')[0]}"


def extra_row(info: dict) -> tuple[str, str]:
    """(result, detail): is the cupy for torch's CUDA the one installed?"""
    extra = cuda_extra(info.get("torch_cuda"))
    if extra is None:
        return "info", "CPU build of torch: no extra"
    want = f"cupy-{extra}x"
    have = sorted(info.get("cupy") or {})
    fix = f"pip install 'commrt[{extra}]'"
    if want in have:
        return PASSED, f"commrt[{extra}]: {want} {info['cupy'][want]}"
    if have:
        return FAILED, f"torch is CUDA {info['torch_cuda']}, {have[0]} installed: {fix}"
    return FAILED, f"no cupy: {fix}"


def probe(steps: Steps) -> list[str]:
    code, out = steps.run([sys.executable, "-c", _PROBE], "probe")
    try:
        info = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [row("what is installed", FAILED, out.strip()[-60:])]
    torch_v = info.get("torch") or f"missing ({info.get('torch_error', '?')})"
    cupy = ", ".join(f"{k} {v}" for k, v in (info.get("cupy") or {}).items()) or "no cupy"
    gpu = info.get("gpu")
    return [
        row("Python, torch", "info", f"{info['python']}, torch {torch_v}"),
        row("torch.version.cuda", "info", info.get("torch_cuda") or "none (CPU build)"),
        row("GPU", "info", f"{gpu} × {info['gpus']}" if gpu else "none: no CUDA GPU"),
        row("Triton, cupy", "info", f"Triton {info.get('triton') or 'missing'}, {cupy}"),
        row("NCCL", "info", info.get("nccl") or f"not loaded ({info.get('nccl_error')})"),
        row("cupy for torch's CUDA", *extra_row(info)),
    ]


# ------------------------------------------------------------ 2. import commrt


def package_dirs() -> dict[str, str]:
    """Import package -> its folder in this tree: pyproject.toml's package-dir, the one
    place that declares the map (``commrt.kernels`` -> ``kernels``)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


_WHERE = r"""
import importlib, json, os, sys
names = sys.argv[1:]
print(json.dumps([os.path.realpath(importlib.import_module(n).__file__) for n in names]))
"""


def imports_from_here(steps: Steps) -> tuple[bool, str]:
    """(commrt and its two mapped packages import from this tree, why not)."""
    homes = package_dirs()
    code, out = steps.run([sys.executable, "-c", _WHERE, *homes], "import")
    if code != 0:
        return False, (out.strip().splitlines() or ["?"])[-1]
    got = json.loads(out.strip().splitlines()[-1])
    want = [os.path.realpath(os.path.join(ROOT, d, "__init__.py")) for d in homes.values()]
    if got != want:
        return False, f"imports from {os.path.dirname(os.path.dirname(got[0]))}"
    return True, ""


def pip_install(steps: Steps) -> tuple[bool, str]:
    """``pip install -e .`` with nothing downloaded: no index, no build isolation (the
    build uses the setuptools installed), no dependencies."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps"]
    cmd += ["--no-index", "--disable-pip-version-check", "-q", "-e", ROOT]
    code, out = steps.run(cmd, "import", PIP_NO_INPUT="1")
    return code == 0, (out.strip().splitlines() or ["?"])[-1]


#: the folder of links of the path-based import, under --logs
LINKS = "gpu_check_import"


def link_farm(out: str) -> str:
    """A folder holding ``commrt/``: links to every entry of this tree's commrt/, plus each
    folder that package-dir maps under it (``kernels`` as commrt.kernels). Returns the
    folder to put on PYTHONPATH."""
    top = os.path.join(os.path.abspath(out), LINKS)
    pkg = os.path.join(top, "commrt")
    os.makedirs(pkg, exist_ok=True)
    links = {e: os.path.join(ROOT, "commrt", e) for e in os.listdir(os.path.join(ROOT, "commrt"))}
    links.pop("__pycache__", None)
    for name, folder in package_dirs().items():
        if name.startswith("commrt."):
            links[name.removeprefix("commrt.")] = os.path.join(ROOT, folder)
    for name, target in links.items():
        path = os.path.join(pkg, name)
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(target, path)
    return top


def import_step(steps: Steps, how: str) -> str:
    """Make commrt import from this tree in every child (see the module docs): ``how`` is
    "auto" (as it is, else pip, else links), "pip" or "path"."""
    ok, why = imports_from_here(steps) if how == "auto" else (False, f"--import {how}")
    if ok:
        return row("import commrt", PASSED, "already imports from this tree")
    if how in ("auto", "pip"):
        installed, pip_says = pip_install(steps)
        ok, why = imports_from_here(steps) if installed else (False, pip_says)
        if ok:
            return row("import commrt", PASSED, "pip -e, offline, no build isolation")
        if how == "pip":
            return row("import commrt", FAILED, why)
    # the links: PYTHONSAFEPATH keeps the tree itself (the working directory) off sys.path,
    # where its commrt/ would come first and lack commrt.kernels
    steps.extra = {"PYTHONPATH": link_farm(steps.logs), "PYTHONSAFEPATH": "1"}
    ok, why = imports_from_here(steps)
    if ok:
        return row("import commrt", PASSED, "path-based, nothing installed")
    return row("import commrt", FAILED, why)


_WARM = r"""
import sys, time, torch
if not torch.cuda.is_available():
    print("no CUDA GPU on this machine")
    sys.exit(3)
from commrt.kernels import pack, reduce_, unpack
start = time.monotonic()
for n in (1000, 1 << 16, 1 << 22):  # the launch configurations differ with the size
    grads = [torch.randn(n, device="cuda")]
    for wire in (torch.float32, torch.bfloat16, torch.float16):
        bucket = torch.empty(n, dtype=wire, device="cuda")
        pack(grads, bucket, scale=0.5)
        reduce_(bucket, bucket.clone())
        reduce_(grads[0], bucket)
        unpack(bucket, grads)
torch.cuda.synchronize()
print(f"{time.monotonic() - start:.1f} s")
"""


def warm_up(steps: Steps) -> str:
    """The row of compiling the kernels once (module docs, step 2): the GPU tests' ranks
    then load them from Triton's cache. A failure here fails the row, not the check's
    later steps (they compile for themselves)."""
    code, out = steps.run([sys.executable, "-c", _WARM], "warmup")
    lines = [ln for ln in out.strip().splitlines() if ln.strip()] or ["(no output)"]
    if code is None:
        return row("kernels compiled (warm-up)", *steps.cut("warmup"))
    if code == 3:
        return row("kernels compiled (warm-up)", NOT_RUN, lines[-1])
    if code != 0:
        return row("kernels compiled (warm-up)", FAILED, lines[-1])
    return row("kernels compiled (warm-up)", PASSED, f"pack, unpack, reduce_ in {lines[-1]}")


_SMOKE = r"""
import subprocess, sys, time, torch
if not torch.cuda.is_available():
    print("no CUDA GPU"); sys.exit(3)
from commrt.transports.cuda_ipc_device import CudaDevice
MODES = {0: "default", 1: "exclusive thread", 2: "prohibited", 3: "exclusive process"}
start = time.monotonic()
dev = CudaDevice(torch.device("cuda", 0))
mode = "compute mode " + MODES.get(dev.rt.deviceGetAttribute(20, 0), "?")  # ComputeMode
why = dev.unusable()
if why:
    print(f"{mode}; {why}"); sys.exit(4)
value = torch.tensor([42], dtype=torch.int32, device="cuda")
try:
    slab, stream, event = dev.allocate(4), dev.new_stream(), dev.create_event()
    dev.copy(slab, value.data_ptr(), 4, stream)
    dev.record(event, stream)
    handles = [dev.export_memory(slab).hex(), dev.export_event(event).hex()]
    child = subprocess.run([sys.executable, "-c", sys.argv[1], *handles],
                           capture_output=True, text=True, timeout=float(sys.argv[2]))
except subprocess.TimeoutExpired:
    print(f"{mode}; the other process did not answer in {sys.argv[2]} s"); sys.exit(4)
except Exception as e:
    print(f"{mode}; CUDA IPC refused here: {e}"); sys.exit(4)
said = (child.stdout.strip().splitlines() or child.stderr.strip().splitlines() or ["?"])[-1]
if child.returncode != 0 or said != "42":
    print(f"{mode}; CUDA IPC refused here: {said}"); sys.exit(4)
print(f"{mode}; a slab and an event crossed processes in {time.monotonic() - start:.1f} s")
"""

#: the other process of the IPC smoke step: opens the slab and the event, waits for the
#: event on a stream of its own, reads the value back
_SMOKE_PEER = r"""
import sys, torch
from commrt.transports.cuda_ipc_device import CudaDevice
dev = CudaDevice(torch.device("cuda", 0))
slab, event = dev.open_memory(bytes.fromhex(sys.argv[1])), dev.open_event(bytes.fromhex(sys.argv[2]))
out, stream = torch.zeros(1, dtype=torch.int32, device="cuda"), dev.new_stream()
dev.wait_event(stream, event)
dev.copy(out.data_ptr(), slab, 4, stream)
stream.synchronize()
print(int(out.item()))
"""


def ipc_smoke(steps: Steps) -> tuple[str, str | None]:
    """(The row of step 2's IPC smoke, why the cuda_ipc checks cannot run or None): one
    slab and one event exported here and used by another process, within
    ``LIMITS["ipc"]``, through the transport's own device calls; the GPU's compute mode."""
    code, out = steps.run([sys.executable, "-c", _SMOKE, _SMOKE_PEER, str(IPC_PEER_S)], "ipc")
    last = (out.strip().splitlines() or ["(no output)"])[-1]
    if code is None:
        result, detail = steps.cut("ipc")
        return row("CUDA IPC smoke", result, detail), f"the IPC smoke step was {result}"
    if code == 3:
        return row("CUDA IPC smoke", NOT_RUN, last), None
    if code != 0:
        return row("CUDA IPC smoke", NOT_RUN, last), f"CUDA IPC refused: {last}"
    return row("CUDA IPC smoke", PASSED, last), None


# ------------------------------------------------------------ 3. the GPU tests


def killed_rows(killed: list[str], cut: tuple[str, str]) -> list[str]:
    """A row per test file stopped at the time limit (``cut``: see :meth:`Steps.cut`)."""
    return [row(f, *cut) for f in killed]


def run_test_files(steps: Steps, files: list[str]) -> tuple[dict[str, dict], list[str]]:
    """Every file in its own pytest, all at once; their results, and the files killed at
    the time limit."""
    limit = steps.limit("tests")
    if limit < MIN_STEP:
        return {}, [os.path.basename(f) for f in files]
    procs = []
    for f in files:
        stem = os.path.splitext(os.path.basename(f))[0]
        results = os.path.join(steps.logs, f"gpu_check_{stem}.jsonl")
        if os.path.exists(results):
            os.remove(results)
        log = open(os.path.join(steps.logs, f"gpu_check_{stem}.txt"), "w")
        # -n 0: the cases share the one GPU, one at a time (the suite's -n auto says 2)
        cmd = [sys.executable, "-m", "pytest", f, "-q", "-rA", "-p", "gpu_check", "-n", "0"]
        cmd += ["-p", "no:cacheprovider"]
        logs = os.path.join(steps.logs, RANK_LOGS)
        env = steps.env(**{RESULTS_ENV: results, RANK_LOGS_ENV: logs})
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        procs.append((f, proc, results, log))
    tests, killed = {}, []
    end = time.monotonic() + max(limit, 0)
    for f, proc, results, log in procs:
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its spawned workers too
            proc.wait()
            killed.append(os.path.basename(f))
        log.close()
        tests.update(read_results(results))
        if proc.returncode not in PYTEST_ENDED and os.path.basename(f) not in killed:
            tests.update(crashed(f, proc.returncode, log.name))
    return tests, killed


#: pytest's own exit codes: all passed, some failed, interrupted, internal error, usage
#: error, nothing collected. Anything else (a negative signal, 134 from a CUDA abort) is
#: a crash: the tests it had not reported yet never ran
PYTEST_ENDED = (0, 1, 2, 3, 4, 5)


def crashed(path: str, code: int, log: str) -> dict[str, dict]:
    """A failed test standing for a pytest of ``path`` that crashed with ``code`` (its
    tests that reported before stay as they were); the tail of its ``log`` goes to a file
    beside the log, and the row names it."""
    with open(log, errors="replace") as f:
        tail = f.read().splitlines()[-CRASH_TAIL:]
    last = next((ln.strip() for ln in reversed(tail) if ln.strip()), "(no output)")
    with open(log.removesuffix(".txt") + "_crash.txt", "w") as f:
        f.write("\n".join(tail) + "\n")
    why = f", {signal.Signals(-code).name}" if -code in signal.valid_signals() else ""
    message = f"pytest crashed (exit {code}{why}): {last}"
    node = f"{path}::{os.path.basename(path)} (crashed)"
    return {node: {"nodeid": node, "outcome": "failed", "gpu": True, "seconds": 0.0,
                   "message": message}}  # fmt: skip


# ------------------------------------------------------------ 4. the kernel benchmark


#: step -> (benchmark file, stem of its files under --out)
BENCHES = {
    "bench": ("bench/bench_kernels.py", "gpu_check_bench"),
    "hotpath": ("bench/bench_hotpath_gpu.py", "gpu_check_hotpath"),
}


def run_bench(steps: Steps, step: str = "bench") -> tuple[str, str]:
    """The CUDA cases of ``step``'s benchmark file (:data:`BENCHES`); (result, detail)."""
    path, stem = BENCHES[step]
    results, log = os.path.join(steps.logs, f"{stem}.jsonl"), f"{stem}.txt"
    if os.path.exists(results):
        os.remove(results)
    cmd = [sys.executable, "-m", "pytest", path, "-m", "gpu", "-rs"]
    cmd += ["--benchmark-only", "-q", "-p", "gpu_check", "-p", "no:cacheprovider"]
    code, out = steps.run(cmd, step, **{RESULTS_ENV: results})
    with open(os.path.join(steps.out, log), "w") as f:
        f.write(out)
    if code is None:
        result, detail = steps.cut(step)
        return result, detail + f"; log in {log}"
    result, detail = bench_result(read_results(results), log)
    if code not in (0, 5) and result != FAILED:  # 5: pytest collected nothing (-m gpu)
        return FAILED, f"pytest exit {code}: see {log}"
    return result, detail


def not_built_rows() -> list[str]:
    """A row per measurement of the hot path that has nothing to run yet."""
    return [row(name, ABSENT, why) for name, why in NOT_BUILT.items()]


# ------------------------------------------------------------ 6. kernel GB/s


def kernel_rows(steps: Steps, sizes_mb) -> tuple[list[str], str, str]:
    """GB/s rows from a child (it imports Triton without TRITON_INTERPRET); and the step's
    (result, detail)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--kernels", *map(str, sizes_mb)]
    code, out = steps.run(cmd, "kernels")
    lines = [_cut(ln, WIDTH, squash=False) for ln in out.splitlines() if ln.strip()]
    if code is None:
        return [], *steps.cut("kernels")
    if code == 3:
        return [], NOT_RUN, lines[-1] if lines else "no CUDA GPU"
    if code != 0:
        return [], FAILED, " ".join(lines)[-60:]
    return lines, PASSED, f"{', '.join(map(str, sizes_mb))} MB buckets"


def measure(sizes_mb) -> int:
    """(In the child.) Print GB/s of pack/unpack per wire dtype and of the receive-reduce,
    each against ``Tensor.copy_`` of the same elements, per bucket size; 3 without a GPU."""
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU on this machine")
        return 3
    from commrt.cli.bench import measure_kernels, seconds_per_call
    from commrt.kernels import reduce_

    print(f"{'bucket':>7} {'wire':>5} {'pack':>7} {'unpack':>7} {'copy':>7} GB/s {'pack/copy':>9}")
    for wire, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for r in measure_kernels([mb * MB for mb in sizes_mb], wire=wire, device="cuda"):
            gbs = [m / x.time_s / 1e9 for m, x in zip(r.moved, r.results)]
            size = f"{r.nbytes // MB} MB"
            print(f"{size:>7} {name:>5} {gbs[0]:7.0f} {gbs[1]:7.0f} {gbs[2]:7.0f}      "
                  f"{gbs[0] / gbs[2]:9.0%}")  # fmt: skip
    for mb in sizes_mb:
        n = mb * MB // 4
        dst, src = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        half = src.to(torch.bfloat16)
        t_red = seconds_per_call(lambda: reduce_(dst, half), "cuda")  # noqa: B023
        t_copy = seconds_per_call(lambda: dst.copy_(src), "cuda")  # noqa: B023
        red, copy = n * (4 + 2 + 4) / t_red / 1e9, n * 8 / t_copy / 1e9
        print(f"{mb:>4} MB reduce fp32 += bf16 {red:7.0f} GB/s, copy {copy:7.0f} GB/s, "
              f"{red / copy:4.0%}")  # fmt: skip
    return 0


# ------------------------------------------------------------ the command


class Summary:
    """``summary.txt`` under --out: each row appended the moment it is known (a run cut
    short, or a machine taken back, still leaves what it found), and the whole table
    written over it at the end."""

    def __init__(self, out: str, after=lambda: None):
        self.path, self.after = os.path.join(out, SUMMARY), after
        with open(self.path, "w") as f:
            f.write(f"commrt GPU check, rows as they come ({time.strftime('%H:%M:%S')})\n")

    def note(self, *rows: str) -> list[str]:
        """Append ``rows``, then call ``after`` (the logs' archive follows each step)."""
        with open(self.path, "a") as f:
            f.write("".join(r + "\n" for r in rows))
        self.after()
        return list(rows)

    def final(self, lines: list[str]) -> None:
        with open(self.path, "w") as f:
            f.write("\n".join(lines) + "\n")


def check(a) -> tuple[list[str], int]:
    """Run every step; the table's lines and the exit status."""
    start = time.monotonic()
    os.makedirs(a.out, exist_ok=True)
    logs = a.logs or tempfile.mkdtemp(prefix="gpu_check_logs-")
    os.makedirs(logs, exist_ok=True)
    steps = Steps(a.out, a.budget, logs)
    table = Summary(a.out, after=steps.pack)
    note = table.note
    rule = "-" * WIDTH
    lines = ["=" * WIDTH, row("commrt GPU check", "result", "detail"), rule]
    env_rows = note(*probe(steps))
    imported = note(import_step(steps, a.imports))[0]
    lines += env_rows + [imported]
    results = [result_of(ln) for ln in env_rows + [imported]]
    summary = []
    if results[-1] == PASSED:
        warm = note(warm_up(steps))[0]
        lines.append(warm)
        results.append(result_of(warm))
        smoke, ipc_refused = ipc_smoke(steps)
        lines.append(note(smoke)[0])
        results.append(result_of(smoke))
        files = sorted(glob.glob(os.path.join(ROOT, "tests", "gpu", "test_*.py")))
        if ipc_refused:
            files = [f for f in files if os.path.basename(f) not in IPC_FILES]
        tests, killed = run_test_files(steps, [os.path.relpath(f, ROOT) for f in files])
        lines += [rule] + note(*case_rows(tests), *killed_rows(killed, steps.cut("tests")))
        whole = steps.cut("tests") if killed else tests_result(tests)
        summary += note(row("GPU tests", *whole), *required_rows(tests, ipc_refused)[0])
        if a.quick:
            summary += note(row("kernel benchmark (CUDA cases)", "omitted", "--quick"))
            summary += note(row("GPU hot path (CUDA cases)", "omitted", "--quick"))
        else:
            summary += note(row("kernel benchmark (CUDA cases)", *run_bench(steps)))
            summary += note(row("GPU hot path (CUDA cases)", *run_bench(steps, "hotpath")))
            summary += note(*not_built_rows())
        gbs, result, detail = kernel_rows(steps, [16] if a.quick else [1, 4, 16, 64, 1024])
        lines += ([rule] + note(*gbs)) if gbs else []
        summary += note(row("kernel GB/s vs copy_", result, detail))
    else:
        summary += note(row("GPU tests, benchmark", NOT_RUN, "commrt does not import"))
    lines += [rule] + summary
    results += [result_of(ln) for ln in summary]
    status = exit_status(results)
    verdict = {0: PASSED, 1: FAILED, 2: NOT_RUN}[status]
    lines += [rule, row("logs", "info", f"{LOGS_ARCHIVE}; unpacked: {logs}")]
    lines.append(row("result", verdict, f"exit {status}, {time.monotonic() - start:.0f} s"))
    lines.append("=" * WIDTH)
    table.final(lines)
    steps.pack()
    return lines, status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # the device machine brings back only what is written under $OUT
    out = os.environ.get("OUT") or os.path.join("out", "gpu_check")
    ap.add_argument("--out", default=out,
                    help="folder for the table and the logs' archive (default: $OUT, else "
                    "%(default)s)")  # fmt: skip
    ap.add_argument("--logs", help="folder for every log, packed into --out after each step "
                    "(default: a new temporary folder)")  # fmt: skip
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help="seconds for the whole check (default: %(default)s)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="no benchmark; one bucket size")
    ap.add_argument("--import", dest="imports", choices=("auto", "pip", "path"), default="auto",
                    help="how commrt is made importable (default: as it is, else pip, else "
                    "links)")  # fmt: skip
    ap.add_argument("--kernels", type=int, nargs="+", help=argparse.SUPPRESS)  # the child
    a = ap.parse_args(argv)
    if a.kernels:
        return measure(a.kernels)
    lines, status = check(a)
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
