"""tools/gpu_check.py's verdicts, from fake pytest runs: a step that ran nothing on the GPU
is NOT RUN, never passed, even where pytest exits 0; and bench/conftest.py leaves Triton
compiled where CUDA is present (its TRITON_INTERPRET=1 made every CUDA case skip).

The check's run from a copy of the tree, offline, is tests/multiprocess/test_gpu_check_offline.py.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import time

import gpu_check as G  # tools/ is on sys.path (tests/conftest.py)
import pytest

REPO = os.path.dirname(G.TOOLS)

#: a stand-in for bench_kernels.py: CPU cases that pass, CUDA cases that skip (as they do
#: wherever TRITON_INTERPRET=1 or no GPU), and a module pytest exits 0 on
FAKE_BENCH = """
import pytest

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(True, reason="{why}")])

@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mb", [1, 4])
def test_throughput(device, mb):
    assert {fail} is False
"""


def _run_fake(tmp_path, why="no CUDA GPU on this machine", fail=False, skip_cuda=True):
    """Run the stand-in under pytest with the check's plugin; (pytest's exit code, results)."""
    body = FAKE_BENCH.format(why=why, fail=fail)
    if not skip_cuda:
        body = body.replace("pytest.mark.skipif(True", "pytest.mark.skipif(False")
    path = tmp_path / "bench_fake.py"
    path.write_text(textwrap.dedent(body))
    results = tmp_path / "results.jsonl"
    env = dict(os.environ, PYTHONPATH=G.TOOLS, **{G.RESULTS_ENV: str(results)})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(path),
            "-q",
            "-p",
            "gpu_check",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, G.read_results(str(results))


def test_a_benchmark_whose_cuda_cases_all_skipped_is_not_run_though_pytest_passed(tmp_path):
    code, tests = _run_fake(tmp_path)
    assert code == 0  # what the check used to call "passed"
    assert [t["outcome"] for t in tests.values()] == ["passed", "skipped"] * 2
    assert [t["gpu"] for t in tests.values()] == [False, True] * 2  # the mark, not the name
    result, detail = G.bench_result(tests)
    assert result == G.NOT_RUN and detail.startswith("no CUDA GPU on this machine"), detail
    assert "0 of 2 CUDA cases ran" in detail
    assert G.exit_status(["info", G.PASSED, result]) == 2


def test_the_benchmark_passes_only_when_every_cuda_case_ran(tmp_path):
    code, tests = _run_fake(tmp_path, skip_cuda=False)
    assert code == 0 and G.bench_result(tests)[0] == G.PASSED
    some = dict(tests)
    first_cuda = next(k for k, t in some.items() if t["gpu"])
    some[first_cuda] = dict(some[first_cuda], outcome="skipped", message="out of memory")
    assert G.bench_result(some) == (G.NOT_RUN, "out of memory; 1 of 2 CUDA cases ran")
    code, tests = _run_fake(tmp_path / "..", fail=True, skip_cuda=False)
    result, detail = G.bench_result(tests)
    assert code == 1 and result == G.FAILED and "assert True is False" in detail


def test_no_gpu_test_ran_is_not_run_and_a_required_check_that_skipped_too():
    tests = {
        "tests/gpu/test_kernels_gpu.py::test_kernels_compile_for_sm90": dict(
            outcome="passed", gpu=False, seconds=4.0, message=""
        ),
        "tests/gpu/test_gpu.py::test_bf16_wire_dtype_through_the_compiled_kernels": dict(
            outcome="skipped", gpu=True, seconds=0, message="no CUDA GPU on this machine"
        ),
    }
    assert G.tests_result(tests) == (G.NOT_RUN, "no CUDA GPU on this machine")
    rows, results = G.required_rows(tests)
    assert results == [G.NOT_RUN] * len(G.REQUIRED)
    (bf16,) = [r for r in rows if r.startswith("GradientSync bf16")]
    assert "NOT RUN   no CUDA GPU" in bf16
    (ddp,) = [r for r in rows if r.startswith('DDP "commrt" vs NCCL')]
    assert "did not run" in ddp  # missing altogether: not run, not passed
    tests["tests/gpu/test_gpu.py::test_bf16_wire_dtype_through_the_compiled_kernels"].update(
        outcome="passed", message=""
    )
    assert G.tests_result(tests) == (G.PASSED, "1 ran on the GPU, 0 skipped")


def test_a_gpu_test_file_that_does_not_import_fails(tmp_path):
    bad = tmp_path / "test_broken.py"
    bad.write_text("import no_such_module_here\n")
    results = tmp_path / "r.jsonl"
    env = dict(os.environ, PYTHONPATH=G.TOOLS, **{G.RESULTS_ENV: str(results)})
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(bad),
            "-q",
            "-p",
            "gpu_check",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    tests = G.read_results(str(results))
    assert [t["outcome"] for t in tests.values()] == ["failed"]
    assert G.tests_result(tests)[0] == G.FAILED


def test_rows_fit_80_columns_and_the_status_orders_failed_before_not_run():
    line = G.row("x" * 50, G.NOT_RUN, "y" * 100)
    assert len(line) == 80 and G.result_of(line) == G.NOT_RUN
    assert G.exit_status([G.PASSED, "info"]) == 0
    assert G.exit_status([G.PASSED, G.NOT_RUN]) == 2
    assert G.exit_status([G.NOT_RUN, G.KILLED]) == 1


def test_the_cuda_extra_follows_torchs_cuda_not_the_drivers():
    assert G.cuda_extra("13.0") == "cuda13" and G.cuda_extra("12.8") == "cuda12"
    assert G.cuda_extra(None) is None
    cu13 = {"torch_cuda": "13.0", "cupy": {"cupy-cuda13x": "14.2.0"}}
    assert G.extra_row(cu13) == (G.PASSED, "commrt[cuda13]: cupy-cuda13x 14.2.0")
    result, detail = G.extra_row({"torch_cuda": "13.0", "cupy": {"cupy-cuda12x": "14.0.1"}})
    assert result == G.FAILED and "pip install 'commrt[cuda13]'" in detail
    assert G.extra_row({"torch_cuda": None})[0] == "info"


def test_bench_conftest_leaves_triton_compiled_where_cuda_is_present():
    """Run bench/conftest.py with torch.cuda.is_available answering True, then False."""
    probe = (
        "import os, runpy, torch; torch.cuda.is_available = lambda: {}; "
        "runpy.run_path('bench/conftest.py'); print(os.environ.get('TRITON_INTERPRET'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    seen = []
    for cuda in (True, False):
        out = subprocess.run(
            [sys.executable, "-c", probe.format(cuda)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        seen.append(out.stdout.split()[-1])
    assert seen == ["None", "1"]


def test_the_plugin_records_nothing_without_its_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(G.RESULTS_ENV, raising=False)

    class Report:
        nodeid, when, outcome, passed, skipped = "t::x", "call", "passed", True, False

    G.pytest_runtest_logreport(Report())
    monkeypatch.setenv(G.RESULTS_ENV, str(tmp_path / "r.jsonl"))
    G.pytest_runtest_logreport(Report())
    (rec,) = [json.loads(ln) for ln in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert rec["outcome"] == "passed" and rec["gpu"] is False


# ------------------------------------------------------------ kernel timing


class _FakeCuda:
    """torch.cuda's timing calls, logged: events, synchronisations, and the calls timed."""

    def __init__(self, monkeypatch):
        import torch

        self.log = []
        log = self.log

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing

            def record(self):
                log.append("record")

            def synchronize(self):
                log.append("wait")

            def elapsed_time(self, other):
                return 6.0  # ms

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("sync"))

    def call(self):
        self.log.append("call")


def _rounds(log):
    """The rounds of a log: what lies between each "record" and the next."""
    text = " ".join(log)
    return [r.split() for r in text.split("record")[1::2]]


def test_kernel_timing_queues_many_launches_between_two_cuda_events(monkeypatch):
    """commrt.cli.bench.seconds_per_call (gpu_check's GB/s rows, commrt bench kernels) and
    bench_kernels.py's rounds: no synchronisation between the calls of a round."""
    import importlib.util

    from commrt.cli.bench import seconds_per_call

    fake = _FakeCuda(monkeypatch)
    per_call = seconds_per_call(fake.call, "cuda", rounds=3)
    rounds = _rounds(fake.log)
    assert len(rounds) == 3 and all(set(r) == {"call"} and len(r) > 1 for r in rounds), fake.log
    assert per_call == 6.0 / 1e3 / len(rounds[0])

    # bench_kernels.py's rounds: behind a sleep, rotating through the buffer sets
    # (the timing itself: tests/unit/test_bench_cuda_timing.py)
    monkeypatch.syspath_prepend(f"{REPO}/bench")
    spec = importlib.util.spec_from_file_location(
        "bench_kernels_t", f"{REPO}/bench/bench_kernels.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "gpu_seconds", lambda fns, reps, host_s: (len(fns) * reps, False))
    assert mod._round_seconds([fake.call] * 3, 50, "cuda", 1e-5) == 150
    fake.log.clear()
    assert mod._round_seconds([fake.call, lambda: fake.log.append("b")], 4, "cpu") > 0
    assert fake.log == ["call", "b"] * 2
    assert 1024 in mod.CUDA_SIZES_MB and 1024 not in mod.SIZES_MB  # 1 GiB on the GPU only


def test_kernel_timing_on_the_cpu_still_times_rounds_of_calls():
    from commrt.cli.bench import measure_kernels, seconds_per_call

    calls = []
    assert seconds_per_call(lambda: calls.append(1), "cpu", rounds=2) > 0
    assert len(calls) > 4  # warm, estimate, then rounds of many calls
    (row,) = measure_kernels([1 << 16], device="cpu", repeats=2)
    assert [r.name for r in row.results] == ["pack", "unpack", "copy", "cat+scale"]
    assert all(r.time_s > 0 for r in row.results)


def test_the_gpu_tests_come_first_in_a_short_budget(tmp_path):
    """Each step gets its own limit where the budget has it, and later steps what is left:
    a --budget of 250 once killed the GPU tests because 175 s were kept back for the
    benchmark after them, which then finished with time to spare."""
    tests = G.LIMITS["tests"]
    for budget, want in [(tests - 40, tests - 40), (tests + 50, tests), (tests + 1000, tests)]:
        got = G.Steps(str(tmp_path), budget).limit("tests")
        assert want - 2 < got <= want, (budget, got)


@pytest.mark.slow
def test_a_test_file_killed_at_its_limit_says_how_to_give_it_more(tmp_path):
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    steps = G.Steps(str(tmp_path), G.MIN_STEP + 1)
    tests, killed = G.run_test_files(steps, [str(slow)])
    assert killed == ["test_slow.py"] and tests == {}
    (line,) = G.killed_rows(killed, steps.cut("tests"))
    assert G.result_of(line) == G.KILLED and len(line) <= 80
    assert line.endswith(f"after {G.MIN_STEP + 1} s: raise --budget")
    # a step the budget leaves no time is not started, and says so
    spent = G.Steps(str(tmp_path), 0)
    assert spent.run(["true"], "bench")[0] is None
    assert spent.cut("bench") == (G.NOT_RUN, "no time left: raise --budget")
    assert G.run_test_files(spent, [str(slow)]) == ({}, ["test_slow.py"])
    assert spent.cut("tests")[0] == G.NOT_RUN


def test_a_pytest_that_crashes_after_a_pass_fails_its_row_with_the_log_tail(tmp_path):
    """A segfault (here SIGSEGV sent to itself) after one test passed: the file's row is
    FAILED with the exit and the log's last line, the passed test stays passed, and the
    step as a whole fails."""
    crash = tmp_path / "test_crash.py"
    crash.write_text(
        "import os, signal\n\ndef test_first():\n    pass\n\n"
        "def test_second():\n    print('about to crash', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    steps = G.Steps(str(tmp_path), 120)
    tests, killed = G.run_test_files(steps, [str(crash)])
    assert killed == [], killed
    outcomes = {k.split("::")[-1]: t["outcome"] for k, t in tests.items()}
    assert outcomes == {"test_first": "passed", "test_crash.py (crashed)": "failed"}, tests
    rows = G.case_rows(tests)
    (bad,) = [r for r in rows if G.result_of(r) == G.FAILED]
    assert "pytest crashed (exit -11, SIGSEGV)" in bad and len(bad) <= 80, bad
    assert G.tests_result(tests)[0] == G.FAILED
    tail = (tmp_path / "gpu_check_test_crash_crash.txt").read_text()
    assert "Fatal Python error: Segmentation fault" in tail, tail


@pytest.mark.slow
def test_a_step_killed_at_its_limit_takes_its_whole_group_and_keeps_its_output(tmp_path):
    """A benchmark's ranks are the step's children's children: killed with it, never left
    running into the next step; what the step printed before is kept."""
    pidfile = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen(['sleep', '60']); open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True); time.sleep(60)\n"
    )
    steps = G.Steps(str(tmp_path), G.MIN_STEP + 1)
    rc, out = steps.run([sys.executable, "-c", code], "bench")
    assert rc is None and out.strip() == "started", (rc, out)
    grandchild = int(pidfile.read_text())
    time.sleep(0.5)
    assert (
        not os.path.exists(f"/proc/{grandchild}")
        or open(f"/proc/{grandchild}/stat").read().split()[2] == "Z"
    ), "the step's grandchild outlived it"


def test_the_summary_file_holds_each_row_as_soon_as_it_is_known(tmp_path):
    table = G.Summary(str(tmp_path))
    table.note(G.row("import commrt", G.PASSED, "as it is"))
    first = (tmp_path / G.SUMMARY).read_text().splitlines()
    assert first[0].startswith("commrt GPU check, rows as they come") and len(first) == 2
    assert first[1].startswith("import commrt") and G.result_of(first[1]) == G.PASSED
    table.final(["=" * 80, "the table"])
    assert (tmp_path / G.SUMMARY).read_text() == "=" * 80 + "\nthe table\n"


def test_rank_jobs_save_their_outputs_where_the_check_says():
    from helpers.mp import LOGS_ENV

    assert G.RANK_LOGS_ENV == LOGS_ENV  # the check sets what the tests' helpers read
    assert G.BUDGET_S <= 420 and sum(v for k, v in G.LIMITS.items() if k != "tests") > 0


# ------------------------------------------------------------ the hot-path step


def test_the_hot_path_step_without_a_gpu_is_not_run_and_says_why(tmp_path):
    """The step runs bench/bench_hotpath_gpu.py's CUDA cases; here every one skips, so the
    row is NOT RUN with the reason, never passed, and the log is in the output folder."""
    steps = G.Steps(str(tmp_path), 300)
    result, detail = G.run_bench(steps, "hotpath")
    assert result == G.NOT_RUN, detail
    assert detail.startswith("no CUDA GPU on this machine"), detail
    assert "0 of 11 CUDA cases ran" in detail, detail
    assert "skipped" in (tmp_path / "gpu_check_hotpath.txt").read_text()
    line = G.row("GPU hot path (CUDA cases)", result, detail)
    assert len(line) <= 80 and G.exit_status(["info", G.result_of(line)]) == 2


def test_what_is_not_built_says_so_and_fails_nothing():
    rows = G.not_built_rows()
    assert [r[:34].rstrip() for r in rows] == list(G.NOT_BUILT)
    assert all(G.result_of(r) == G.ABSENT and len(r) <= 80 for r in rows), rows
    assert "CUDA graph replay per bucket" in G.NOT_BUILT
    assert G.exit_status([G.PASSED] + [G.result_of(r) for r in rows]) == 0
    # the hot path runs after the kernel benchmark, with a limit of its own
    order = list(G.LIMITS)
    assert order.index("hotpath") == order.index("bench") + 1 and G.LIMITS["hotpath"] > 0


def test_every_required_checks_label_fits_the_name_column_whole():
    """A label cut to the 34-column name column ('DDP on "commrt" vs NCCL, world o…')
    could not be found by its name in the table."""
    long = [label for label in G.REQUIRED if len(label) > 34]
    assert not long, long


def test_the_ipc_smoke_without_a_gpu_is_not_run_and_refuses_nothing(tmp_path):
    smoke, refused = G.ipc_smoke(G.Steps(str(tmp_path), 120))
    assert G.result_of(smoke) == G.NOT_RUN and "no CUDA GPU" in smoke, smoke
    assert refused is None


def test_where_cuda_ipc_is_refused_each_multi_rank_check_says_why():
    """The multi-rank files did not run: each of their checks is NOT RUN with the smoke's
    reason, and a one-rank check that did not run still names its test."""
    rows, results = G.required_rows({}, "CUDA IPC refused: operation not permitted")
    by_label = {r[:34].rstrip(): r[35:] for r in rows}
    for label in G.IPC_RANKS:
        assert by_label[label].startswith("NOT RUN   CUDA IPC refused"), by_label[label]
    for label in G.ONE_RANK:
        assert by_label[label].startswith("NOT RUN   its test did not run"), by_label[label]
    assert set(results) == {G.NOT_RUN} and set(G.REQUIRED) == {*G.ONE_RANK, *G.IPC_RANKS}
    files = {os.path.basename(f) for f in glob.glob(os.path.join(G.ROOT, "tests/gpu/*.py"))}
    assert set(G.IPC_FILES) <= files, G.IPC_FILES
