"""Shared test set-up.

Triton reads TRITON_INTERPRET when it is first imported, so it is set here,
before any test module imports commrt.kernels: the same @triton.jit kernels
then run on CPU tensors.
"""

import os
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
# auto's memory of earlier jobs (commrt.tuning.memory) is one file per user: tests sharing it
# would learn from each other in whatever order they ran. Its own tests name a file each.
os.environ["COMMRT_AUTO_MEMORY"] = "off"

# tools/ (the namespace-host harness, netns.py) is not a test module: tests import it from there
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
if TOOLS not in sys.path:
    sys.path.append(TOOLS)


#: pytest-xdist workers for ``-n auto``, which pyproject.toml's addopts pass: the suite is kept
#: passing at two (CI's 2 cores), with the modules that share a started job
#: (``xdist_group``) each on one worker. ``-n N`` on the command line, or xdist's own
#: PYTEST_XDIST_AUTO_NUM_WORKERS, chooses another count; ``-n 0`` runs one test at a time.
WORKERS = 2


#: the folders whose modules the suite's processes import (tests/: its helpers and workers)
SOURCES = ("commrt", "algorithms", "kernels", "tests", "tools")


def pytest_configure(config):
    """Compile the project's bytecode once, in the controller, before any test starts.

    Every rank the suite starts imports commrt afresh. Where PYTHONDONTWRITEBYTECODE is set
    (as on CI's machine) no import writes a .pyc, so each of those processes compiled
    commrt's modules from source again: 0.2-0.3 s of CPU a process, over thousands. A
    wheel's install compiles them once, as this does; Python reads a .pyc whatever that
    variable says."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller did it
        return
    import compileall

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in SOURCES:
        compileall.compile_dir(os.path.join(root, folder), quiet=2, workers=1)


def pytest_xdist_auto_num_workers(config):
    """The worker count ``-n auto`` means for the suite (:data:`WORKERS`)."""
    return int(os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or WORKERS)


def pytest_collection_modifyitems(items):
    """The GPU tests share the one GPU of the machines they run on: one worker runs them
    all, one at a time."""
    gpu = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu") + os.sep
    for item in items:
        if str(item.path).startswith(gpu):
            item.add_marker(pytest.mark.xdist_group("gpu"))


@pytest.fixture(scope="session", autouse=True)
def rank_zygote(tmp_path_factory):
    """One zygote per pytest process, from which the helpers fork test ranks with torch
    already imported (tests/helpers/zygote.py says why and what differs)."""
    from helpers import zygote

    proc = zygote.start(str(tmp_path_factory.mktemp("zygote")))
    if proc is not None:
        _ZYGOTE_PID.append(proc.pid)
    yield proc
    zygote.stop(proc)


@pytest.fixture(autouse=True)
def start_up_variables(rank_zygote):
    """After each test, this process's start-up variables as they were before it (so, from
    the first test on, as its zygote started with them), so that a variable an imported module set does not stop every later rank
    from being forked (:func:`helpers.zygote.put_back` says which and why)."""
    from helpers import zygote

    start = zygote.start_vars(os.environ) if rank_zygote is not None else None
    yield
    if start is not None and zygote.start_vars(os.environ) != start:
        zygote.put_back(start)


@pytest.fixture
def netns_cluster():
    """Make namespace hosts (tools/netns.py): ``netns_cluster(hosts, rate="1gbit")``.

    Skips the test with the reason where namespaces cannot be made (not
    root, no ip/tc, creation refused); tears every cluster down afterwards,
    also when the test failed.
    """
    from netns import Cluster, Unavailable

    made = []

    def make(hosts: int, rate: str | None = "1gbit") -> Cluster:
        try:
            c = Cluster(hosts, rate=rate)
        except Unavailable as e:
            pytest.skip(str(e))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# Where the suite's time goes, a line per folder under tests/ (beside --durations' 25
# slowest), so that the next person sees what to cut. The sums are of the tests' own
# durations (set-up, call and tear-down); under xdist they run side by side, so the folders'
# sums add up to more than the wall-clock time, and each folder's share is what it costs.
#
# On CI's 2 cores the suite is bound by CPU, not by waiting, so each test's CPU is counted
# too: the pytest process's own, that of the processes it started and waited for, and that of
# the ranks its zygote forked and reaped (the zygote's own and its children's, from /proc).
# A process still running when its test ends is counted where it is reaped. With
# $TEST_CPU_LOG set, a line per test (CPU s, wall s, node id) is appended to that file.
_FOLDER_SECONDS: dict[str, float] = {}
_FOLDER_CPU: dict[str, float] = {}
_FOLDER_TESTS: dict[str, set[str]] = {}
_TEST_CPU: dict[str, tuple[float, float]] = {}  # node id -> (CPU s, wall s)
_ZYGOTE_PID: list[int] = []  # this pytest process's zygote, once started
#: the user property in which a worker sends its controller a test's CPU seconds
CPU_PROPERTY = "cpu_s"
#: where a test's item keeps the CPU count at its set-up
_CPU_AT_START = pytest.StashKey[float]()


def cpu_seconds() -> float:
    """CPU seconds used so far by this process, its reaped children and its zygote's."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    for pid in _ZYGOTE_PID:
        try:
            with open(f"/proc/{pid}/stat") as f:
                # after "(comm)": fields 14-17 of proc(5) are utime, stime, cutime, cstime
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_START] = cpu_seconds()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        item.user_properties.append((CPU_PROPERTY, cpu_seconds() - item.stash[_CPU_AT_START]))


def _folder(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def pytest_runtest_logreport(report):
    folder = _folder(report.nodeid)
    _FOLDER_SECONDS[folder] = _FOLDER_SECONDS.get(folder, 0.0) + report.duration
    _FOLDER_TESTS.setdefault(folder, set()).add(report.nodeid)
    cpu_s, wall_s = _TEST_CPU.get(report.nodeid, (0.0, 0.0))
    wall_s += report.duration
    for name, value in report.user_properties:
        if name == CPU_PROPERTY and report.when == "teardown":
            cpu_s += value
            _FOLDER_CPU[folder] = _FOLDER_CPU.get(folder, 0.0) + value
    _TEST_CPU[report.nodeid] = (cpu_s, wall_s)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    if not _FOLDER_SECONDS:
        return
    total = sum(_FOLDER_SECONDS.values())
    total_cpu = sum(_FOLDER_CPU.values())
    terminalreporter.write_sep("=", "most CPU (the test's, its processes' and its ranks')")
    ranked = sorted(_TEST_CPU.items(), key=lambda kv: -kv[1][0])
    for nodeid, (cpu_s, wall_s) in ranked[:25]:
        terminalreporter.write_line(f"{cpu_s:7.1f} s CPU {wall_s:7.1f} s  {nodeid}")
    terminalreporter.write_sep("=", "time per folder (the sum of its tests' durations)")
    terminalreporter.write_line("    wall  share      CPU  share  tests  folder")
    for folder, seconds in sorted(_FOLDER_SECONDS.items(), key=lambda kv: -kv[1]):
        tests = len(_FOLDER_TESTS[folder])
        share = 100 * seconds / total if total else 0.0
        cpu = _FOLDER_CPU.get(folder, 0.0)
        cpu_share = 100 * cpu / total_cpu if total_cpu else 0.0
        terminalreporter.write_line(
            f"{seconds:8.1f} {share:5.1f} % {cpu:8.1f} {cpu_share:5.1f} % {tests:6d}  {folder}"
        )
    terminalreporter.write_line(f"{total:8.1f} s wall, {total_cpu:.1f} s CPU in all")
    log = os.environ.get("TEST_CPU_LOG")
    if log and not hasattr(terminalreporter.config, "workerinput"):
        with open(log, "a") as f:
            for nodeid, (cpu_s, wall_s) in ranked:
                f.write(f"{cpu_s:.2f}\t{wall_s:.2f}\t{nodeid}\n")
