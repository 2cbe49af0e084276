"""Keeps the house in order: small modules, classes and functions, no import
cycles (lazy imports included), and no reaching into another object's
private fields. Pure ast over the source: no project module is imported.

The limits count every line of a definition, docstring and comments included.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: source folder -> the import package it installs as (pyproject's package-dir)
PACKAGES = {"commrt": "commrt", "algorithms": "commrt.algorithms", "kernels": "commrt.kernels"}
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 500, 250, 80
#: names whose private attributes belong to the module that defines them
GUARDED = ("comm", "executor", "sync", "policy", "transport")


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every project module."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _where(name: str, node: ast.AST) -> str:
    return f"{MODULES[name].relative_to(ROOT)}:{node.lineno}"


def test_there_is_something_to_check():
    assert "commrt.runtime.communicator" in MODULES and "commrt.algorithms" in MODULES
    assert "commrt.kernels.pack" in MODULES


def test_modules_classes_and_functions_stay_small():
    too_big = []
    for name, tree in TREES.items():
        lines = len(MODULES[name].read_text().splitlines())
        if lines > MAX_MODULE:
            too_big.append(f"{MODULES[name].relative_to(ROOT)}: module of {lines} lines")
        for node in ast.walk(tree):
            size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if node.__class__ is ast.ClassDef and size > MAX_CLASS:
                too_big.append(f"{_where(name, node)}: class {node.name} of {size} lines")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION:
                too_big.append(f"{_where(name, node)}: function {node.name} of {size} lines")
    assert not too_big, "over the limits:\n" + "\n".join(too_big)


def _resolve(name: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[name].name == "__init__.py"
    base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _project_target(dotted: str) -> str | None:
    """The project module an import names (its longest known prefix)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports anywhere (top level or inside a function).

    ``from pkg import mod`` counts as importing ``pkg.mod`` when that is a
    module, otherwise ``pkg`` itself. A package's ``__init__`` runs before
    any of its modules, but importing a module does not make it depend on
    the other modules its package's ``__init__`` imports, so only the named
    module is an edge.
    """
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, node)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                    for a in node.names
                ]
            for t in targets:
                hit = _project_target(t)
                if hit and hit != name:
                    graph[name].add(hit)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts))}


def test_no_import_cycles_lazy_imports_included():
    graph = import_graph()
    # a package's __init__ importing its own modules is how a package is built, not a cycle
    for name in graph:
        graph[name] = {t for t in graph[name] if t not in _parents(name)}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def _private_reaches(tree: ast.AST) -> list[ast.Attribute]:
    """``x._field`` where x is a guarded name (``comm``, ``self.comm``, ``ctx.sync``...)."""
    hits = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            continue
        owner = node.value
        owner_name = (
            owner.id
            if isinstance(owner, ast.Name)
            else owner.attr
            if isinstance(owner, ast.Attribute)
            else None
        )
        if owner_name is None or owner_name == "self" or owner_name == "cls":
            continue
        stem = owner_name.lstrip("_").lower()
        if any(stem == g or stem.endswith("_" + g) or stem.endswith(g) for g in GUARDED):
            hits.append(node)
    return hits


def test_nobody_reaches_into_another_objects_private_fields():
    hits = [
        f"{_where(name, node)}: .{node.attr}"
        for name, tree in TREES.items()
        for node in _private_reaches(tree)
    ]
    assert not hits, "private fields reached from outside:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "source,found",
    [
        ("comm._syncs.add(x)", ["_syncs"]),
        ("self.comm._active_sync = None", ["_active_sync"]),
        ("s = self.comm.executor._scratch", ["_scratch"]),
        ("self._x = comm.rank", []),
        ("obj.__class__", []),
    ],
)
def test_the_private_field_check_sees_what_it_should(source, found):
    assert [n.attr for n in _private_reaches(ast.parse(source))] == found
