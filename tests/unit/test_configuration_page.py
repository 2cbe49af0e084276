"""docs/configuration.md lists every COMMRT_* variable the library reads and every
timeout and bound (the ``*_S`` constants), and nothing the library no longer has.

The library's side is a scan of its source (commrt/, algorithms/, kernels/), so a new
variable or bound fails here until the page names it, with its default and meaning.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers.layout import library_sources

from commrt.cli.launch import CHILD_ENV, LAUNCHED_AT_ENV, REPORTS_ENV
from commrt.runtime.environment import FROM_MPI_ENV

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
VARIABLE = re.compile(r"\bCOMMRT_[A-Z][A-Z0-9_]*\b")
BOUND = re.compile(r"^[A-Z][A-Z0-9_]*_S$")
ROW = re.compile(r"^\| `([\w.]+)` \|", re.MULTILINE)


sources = library_sources


def variables_read() -> set[str]:
    return {v for _, path in sources() for v in VARIABLE.findall(path.read_text("utf-8"))}


def bounds_kept() -> set[str]:
    """``module.NAME`` of every module-level ``*_S`` constant."""
    found = set()
    for module, path in sources():
        for node in ast.parse(path.read_text("utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            targets = [node.target] if isinstance(node, ast.AnnAssign) else targets
            for t in targets:
                names = t.elts if isinstance(t, ast.Tuple) else [t]
                found |= {f"{module}.{n.id}" for n in names if isinstance(n, ast.Name)}
    return {name for name in found if BOUND.match(name.rsplit(".", 1)[1])}


def rows(text: str) -> set[str]:
    return set(ROW.findall(text))


def section(text: str, heading: str) -> str:
    return text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]


def test_the_scans_find_what_the_library_has():
    assert {"COMMRT_DEBUG", "COMMRT_STALL_S", "COMMRT_ALGORITHM"} <= variables_read()
    assert "commrt.runtime.rendezvous.DEFAULT_TIMEOUT_S" in bounds_kept()
    assert "commrt.runtime.stall.MAX_DEFAULT_STALL_S" in bounds_kept()  # one of a pair
    assert "commrt.algorithms.auto_learn.RECHECK_S" in bounds_kept()  # algorithms/ installed


def test_the_page_lists_every_variable_the_library_reads():
    listed = {r for r in rows(PAGE.read_text("utf-8")) if r.startswith("COMMRT_")}
    read = variables_read()
    assert not read - listed, f"read but not on docs/configuration.md: {sorted(read - listed)}"
    assert not listed - read, f"on the page but read nowhere: {sorted(listed - read)}"


def test_the_variables_the_launcher_sets_are_marked_so():
    text = PAGE.read_text("utf-8")
    internal = rows(section(text, "Set by commrt for its own processes"))
    assert {CHILD_ENV, LAUNCHED_AT_ENV, REPORTS_ENV, FROM_MPI_ENV} <= internal
    assert not internal & rows(section(text, "Environment variables you set"))


def test_the_page_lists_every_timeout_and_bound():
    listed = {
        r for r in rows(PAGE.read_text("utf-8")) if "." in r and BOUND.match(r.split(".")[-1])
    }
    kept = bounds_kept()
    assert not kept - listed, f"kept but not on docs/configuration.md: {sorted(kept - listed)}"
    assert not listed - kept, f"on the page but kept nowhere: {sorted(listed - kept)}"
