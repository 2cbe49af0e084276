"""Shared benchmark set-up.

Multi-rank benchmarks run pytest on every rank (``mpiexec -n 4 python -m
pytest bench/...``); the ranks run the same tests in the same order with
fixed round/iteration counts, so their collectives line up. Only rank 0
reports: the other ranks' terminal output is dropped and they write no
JSON. Ranks on one machine get cores / ranks intra-op threads each (unless
OMP_NUM_THREADS says otherwise), as ``commrt``'s own launcher does.

Benchmarks record their figures with :func:`record_bandwidth`; a table of
them (times, GB/s, ratios) is printed at the end, within 80 columns.
pytest-benchmark's own table (ten statistics a test, some 150 columns) is
left out unless ``--benchmark-columns`` is given; ``--benchmark-json PATH``
keeps every statistic either way.
"""

import os
import textwrap

import pytest
import torch


def interpret_without_cuda() -> None:
    """Without a CUDA GPU, Triton runs its kernels in the interpreter on CPU tensors, as in
    tests/. Where CUDA is present the compiled kernels must run: TRITON_INTERPRET=1 there
    (read once, when Triton is imported) would make every CUDA case skip, and the
    benchmark would pass having measured nothing on the GPU."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


interpret_without_cuda()

_RANK = int(
    os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
)
_LOCAL = int(
    os.environ.get(
        "MPI_LOCALNRANKS",
        os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1")),
    )
)
_ROWS_KEY = pytest.StashKey[list]()


def pytest_xdist_auto_num_workers(config):
    """No xdist workers for ``-n auto`` (pyproject.toml's addopts, there for the suite): a
    benchmark is timed alone, every rank runs the same tests in order, and pytest-benchmark
    turns itself off under xdist."""
    return 0


# pytest-benchmark's options that write files; a rank other than 0 turns each off
_WRITERS = {
    "benchmark_json": None,
    "benchmark_save": None,
    "benchmark_autosave": False,
    "benchmark_histogram": None,
}


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Set pytest-benchmark's own options before its session reads them (in its
    ``pytest_configure``). Its wide table (ten statistics a test, some 150 columns) is
    left out unless ``--benchmark-columns`` is given: the summary below has the figures.
    A rank other than 0 writes no JSON, saved run or histogram: every rank parsed the same
    ``--benchmark-json PATH`` and would write over rank 0's report at the end."""
    args = config.invocation_params.args
    if not any(str(a).startswith("--benchmark-columns") for a in args):
        config.option.benchmark_quiet = True
    if _RANK != 0:
        for name, off in _WRITERS.items():
            if hasattr(config.option, name):
                setattr(config.option, name, off)


@pytest.hookimpl(trylast=True)  # after the terminal reporter exists
def pytest_configure(config):
    config.stash[_ROWS_KEY] = []
    if _LOCAL > 1 and "OMP_NUM_THREADS" not in os.environ:
        # ranks share the machine's cores: one intra-op thread pool per rank's share,
        # as commrt's own launcher sets, instead of every rank spawning one per core
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // _LOCAL))
    if _RANK != 0:
        # A rank other than 0 prints nothing: pytest runs without its terminal reporter
        # as it does under ``-p no:terminal`` (redirecting fd 1 here would be undone by
        # pytest's output capture, which is active at this point).
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


@pytest.fixture
def record_bandwidth(request):
    """``record_bandwidth(group, name, size, **columns)`` adds a row to the summary table."""
    rows = request.config.stash[_ROWS_KEY]

    def record(group: str, name: str, size: str, **columns):
        rows.append((group, name, size, columns))

    return record


WIDTH = 80


def summary_lines(rows: list) -> list[str]:
    """The summary table, no line wider than :data:`WIDTH`: per group a heading, then a line
    per row (size, name, its cells); cells that do not fit go on to the next line."""
    lines, last_group = [], None
    for group, name, size, cols in rows:
        if group != last_group:
            lines += [""] * bool(lines) + textwrap.wrap(group, WIDTH)
            last_group = group
        cells = [f"{k} {v:8.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in cols.items()]
        line = f"  {size:>8}  {name:<18}"
        indent = " " * 14
        for cell in cells:
            if len(line) + 2 + len(cell) > WIDTH and line.strip():
                lines.append(line)
                line = indent
            line += ("  " if line.strip() else "") + cell
        lines.append(line)
    return lines


def pytest_terminal_summary(terminalreporter, config):
    rows = config.stash.get(_ROWS_KEY, [])
    if not rows:
        return
    terminalreporter.section("figures", sep="-")
    for line in summary_lines(rows):
        terminalreporter.write_line(line)
