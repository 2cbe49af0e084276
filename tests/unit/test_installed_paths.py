"""No message the library shows names a file that the installed package lacks.

A user with a wheel has no docs/, bench/, tools/ or tests/: an error or a help text that
sends them to ``docs/stalls.md`` sends them nowhere. Docstrings may name those files (they
are read in the source tree); every other string of the library may not. Pure ast.
"""

from __future__ import annotations

import ast
import re

from helpers.layout import library_sources

#: a path into a folder of the repository that the wheel does not hold
REPO_ONLY = re.compile(r"(?<![\w/.])(?:docs|bench|tools|tests|\.ci)/[\w/.-]*\w")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the nodes that are docstrings (a module's, a class's, a function's)."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None) if isinstance(node, kinds) else None
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def repo_paths_said(source: str) -> list[tuple[int, str]]:
    """(line, path) of each repository-only path in a string that is not a docstring."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [
        (node.lineno, path)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        for path in REPO_ONLY.findall(node.value)
    ]


def test_the_scan_sees_a_message_and_spares_a_docstring():
    source = '"""See docs/stalls.md."""\ndef f():\n    """bench/x.py"""\n    raise ValueError(f"see docs/stalls.md ({1})")\n'
    assert repo_paths_said(source) == [(4, "docs/stalls.md")]
    assert repo_paths_said('x = "commrt/diagnosis/stall.py and mydocs/a.md"') == []


def test_no_message_names_a_file_the_wheel_lacks():
    said = [
        f"{path.name}:{line}: {found}"
        for _, path in library_sources()
        for line, found in repo_paths_said(path.read_text("utf-8"))
    ]
    assert not said, "messages that name files an installed package lacks:\n" + "\n".join(said)
