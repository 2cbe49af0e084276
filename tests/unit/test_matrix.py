"""What the project claims is what CI runs (``.ci/matrix.toml``).

pyproject.toml's floors (``requires-python``, ``torch>=``) are the oldest
Python and torch that CI runs; every Python that ``requires-python`` admits,
up to the newest one CI runs, is run by some step of CI; docs/install.md's
table is the matrix, row by row (a row run by hand says so).
"""

from __future__ import annotations

import re
import tomllib

from helpers.layout import PYPROJECT, ROOT
from packaging.specifiers import SpecifierSet
from packaging.version import Version

MATRIX = tomllib.loads((ROOT / ".ci" / "matrix.toml").read_text("utf-8"))
#: every step of the matrix: (what runs, its row), by-hand rows included
STEPS = [
    ("the whole suite", MATRIX["suite"]),
    ("the wheel, installed non-editable and used from outside the tree", MATRIX["wheel"]),
    *(
        (
            "the torch-facing tests"
            + (", against the wheel installed non-editable" if row.get("wheel") else "")
            + ("" if row["ci"] else " (by hand, before a release)"),
            row,
        )
        for row in MATRIX["torch_facing"]["run"]
    ),
]
#: the steps CI runs
IN_CI = [(what, row) for what, row in STEPS if row.get("ci", True)]


def _pythons_run() -> set[Version]:
    return {Version(row["python"]) for _, row in IN_CI}


def unrun_pythons(requires: str, run: set[Version]) -> list[str]:
    """The Python minors that ``requires`` admits, from 3.0 up to the newest in ``run``,
    that no step runs."""
    spec = SpecifierSet(requires)
    newest = max(run)
    admitted = [Version(f"3.{m}") for m in range(newest.minor + 1) if f"3.{m}" in spec]
    return [str(v) for v in admitted if v not in run]


def test_requires_python_admits_no_python_ci_leaves_out():
    requires = PYPROJECT["project"]["requires-python"]
    assert unrun_pythons(requires, _pythons_run()) == [], requires
    floor = min(
        v for v in (Version(f"3.{m}") for m in range(30)) if str(v) in SpecifierSet(requires)
    )
    assert floor == min(_pythons_run()), f"{requires}: the floor is not a Python CI runs"


def test_the_python_check_sees_a_gap():
    run = {Version("3.11"), Version("3.13")}
    assert unrun_pythons(">=3.10", run) == ["3.10", "3.12"]
    assert unrun_pythons(">=3.11", {Version("3.11")}) == []


def test_the_torch_floor_is_the_oldest_torch_ci_runs():
    (torch,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch")]
    floor = re.fullmatch(r"torch>=([\d.]+)", torch).group(1)
    oldest = min((row["torch"] for _, row in IN_CI), key=Version)
    assert Version(floor) == Version(oldest), f"pyproject says {torch}; CI's oldest is {oldest}"


def test_the_install_page_shows_the_matrix():
    page = (ROOT / "docs" / "install.md").read_text("utf-8")
    table = page.split("## What is tested", 1)[1].split("\n## ", 1)[0]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| what runs")
    ]
    want = [[what, row["python"], row["torch"], row["build"]] for what, row in STEPS]
    assert rows == want


def test_a_row_in_the_wheels_venv_is_the_wheels_python_torch_and_build():
    # it makes no venv of its own (tools/ci_matrix.py): it runs beside the wheel's torch
    keys = ("python", "torch", "build")
    in_wheel = [row for row in MATRIX["torch_facing"]["run"] if row.get("wheel")]
    assert in_wheel, "no torch-facing row runs against the installed wheel"
    for row in in_wheel:
        assert {k: row[k] for k in keys} == {k: MATRIX["wheel"][k] for k in keys}, row


def test_the_torch_facing_rows_name_tests_that_exist_and_how_pytest_runs_them():
    facing = MATRIX["torch_facing"]
    assert facing["tests"] and all((ROOT / path).exists() for path in facing["tests"]), facing
    assert "-n" in facing["pytest"], facing  # the rows run them as the suite's workers do


def test_each_torch_row_runs_the_quick_loop_and_the_tests_marked_matrix():
    """A row runs the torch-facing tests of the quick loop and those marked ``matrix``
    (PyTorch's own suite's selection), not every slow one (the suite runs those)."""
    args = MATRIX["torch_facing"]["pytest"]
    assert args[args.index("-m") + 1] == "not slow or matrix", args
    marked = [
        path
        for test in MATRIX["torch_facing"]["tests"]
        for path in sorted((ROOT / test).rglob("test_*.py")) or [ROOT / test]
        if "@pytest.mark.matrix" in path.read_text("utf-8")
    ]
    assert [p.name for p in marked] == ["test_torch_conformance.py"], marked
