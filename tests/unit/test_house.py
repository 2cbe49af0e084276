"""Keeps the house in order: small modules, classes and functions, no import
cycles (lazy imports included), no reaching into another object's private
fields, and a package docstring that names every module of its package. Pure
ast over the source: no project module is imported.

A module's limit counts every line of its file (what a reader scrolls through); a
class's and a function's count their code lines only, so that a docstring or a comment
that says why is never the line cut to stay within.
"""

from __future__ import annotations

import ast
import re

import pytest
from helpers.layout import ROOT, library_sources

MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 500, 250, 80
#: names whose private attributes belong to the module that defines them
GUARDED = ("comm", "executor", "sync", "policy", "transport")


MODULES = dict(library_sources())
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _where(name: str, node: ast.AST) -> str:
    return f"{MODULES[name].relative_to(ROOT)}:{node.lineno}"


def test_there_is_something_to_check():
    assert "commrt.runtime.communicator" in MODULES and "commrt.algorithms" in MODULES
    assert "commrt.kernels.pack" in MODULES


def unnamed_modules(doc: str, modules: list[str]) -> list[str]:
    """The modules (last dotted parts) that ``doc`` does not name. A module is named
    by a ``:mod:`` role that ends in it (``:mod:`~commrt.sync.join``` names ``join``)
    or by its name in double backticks (``simulate_plots`` or ``simulate_plots.py``):
    a word of prose alone ("the ring") does not name the module ``ring``."""
    return [
        m
        for m in modules
        if not re.search(rf":mod:`~?(?:[\w.]+\.)?{re.escape(m)}`|``{re.escape(m)}(?:\.py)?``", doc)
    ]


def test_every_package_docstring_names_its_modules():
    """A newcomer finds every module from its package's docstring, with what it is for."""
    packages = [name for name, path in MODULES.items() if path.name == "__init__.py"]
    assert {"commrt", "commrt.sync.backup", "commrt.kernels"} <= set(packages)
    missing = []
    for package in packages:
        children = [m.rsplit(".", 1)[1] for m in MODULES if m.rpartition(".")[0] == package]
        doc = ast.get_docstring(TREES[package]) or ""
        missing += [f"{package}.{m}" for m in unnamed_modules(doc, children)]
    assert not missing, (
        "modules their package's docstring does not name (add a phrase each):\n"
        + "\n".join(missing)
    )


@pytest.mark.parametrize(
    "doc,missing",
    [
        (":mod:`commrt.sync.join` and :mod:`~commrt.sync.state`", []),
        ("uneven inputs (``join``), the weights (``state.py``)", []),
        ("the ring, the join of two states", ["join", "state"]),
        (":mod:`commrt.sync.joined` (``states``)", ["join", "state"]),
    ],
)
def test_the_package_docstring_check_sees_what_it_should(doc, missing):
    assert unnamed_modules(doc, ["join", "state"]) == missing


def lines_of(node: ast.AST) -> int:
    """Every line a class or function takes, its decorators, docstring, comments and blank
    lines included: what a reader scrolls through."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return node.end_lineno - first + 1


def test_the_line_count_counts_every_line():
    source = '@cache\ndef f():\n    """Say\n    why."""\n\n    # a comment\n    return 1\n'
    assert lines_of(ast.parse(source).body[0]) == 7


def test_modules_classes_and_functions_stay_small():
    """Caps count every line, so a unit fits by being split, never by squeezing its
    lines (see :func:`test_no_formatter_is_told_to_look_away`)."""
    too_big = []
    for name, tree in TREES.items():
        lines = len(MODULES[name].read_text().splitlines())
        if lines > MAX_MODULE:
            too_big.append(f"{MODULES[name].relative_to(ROOT)}: module of {lines} lines")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            size = lines_of(node)
            if node.__class__ is ast.ClassDef and size > MAX_CLASS:
                too_big.append(f"{_where(name, node)}: class {node.name} of {size} lines")
            elif node.__class__ is not ast.ClassDef and size > MAX_FUNCTION:
                too_big.append(f"{_where(name, node)}: function {node.name} of {size} lines")
    assert not too_big, "over the limits:\n" + "\n".join(too_big)


#: what tells ruff's formatter to leave code as written
LOOK_AWAY = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def test_no_formatter_is_told_to_look_away():
    """The library is formatted as ruff formats it, everywhere: no ``# fmt: skip`` or
    ``# fmt: off`` holds a unit under its cap or a line as someone once laid it out."""
    found = [
        f"{MODULES[name].relative_to(ROOT)}:{i}"
        for name in MODULES
        for i, line in enumerate(MODULES[name].read_text().splitlines(), 1)
        if LOOK_AWAY.search(line)
    ]
    assert not found, "formatter told to look away:\n" + "\n".join(found)


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


#: the rooms, bottom to top (docs/ARCHITECTURE.md's diagram): a room imports only rooms on a
#: lower line, or its own; rooms on one line import neither of each other
LAYERS = (
    ("settings",),  # every setting's declaration (commrt.settings)
    ("errors",),  # the errors, and how they reach the user (COMMRT_TRACEBACK)
    ("transports", "kernels"),
    ("schedule",),
    ("algorithms",),
    ("sim",),
    ("process",),  # what one process stands on: threads, waits, the store, the launcher
    ("diagnosis",),  # a failure's diagnosis: departures, abort, the stall watch, the verdict
    ("runtime",),
    ("tuning",),
    ("collectives",),
    ("training",),
    ("sync",),
    ("distributed",),
    ("data", "testing"),  # commrt.data (GossipShuffle); commrt.testing (tests' stand-ins)
    ("commrt",),  # commrt/__init__.py: the public names
    ("cli",),
    ("__main__",),
)


def room(module: str) -> str:
    """The room a module lives in: ``commrt.sync.backup.policy`` -> ``sync``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "commrt"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    level = {r: i for i, line in enumerate(LAYERS) for r in line}
    bad = []
    for name, targets in sorted(graph.items()):
        here = room(name)
        for t in sorted(targets):
            there = room(t)
            if there != here and level[there] >= level[here]:
                bad.append(f"{name} ({here}) imports {t} ({there})")
    return bad


def test_every_module_lives_in_a_known_room():
    levels = {r for line in LAYERS for r in line}
    assert {room(m) for m in MODULES} <= levels, {room(m) for m in MODULES} - levels


def test_rooms_import_one_way_lazy_imports_included():
    bad = layer_violations(import_graph())
    assert not bad, "imports against the map (docs/ARCHITECTURE.md):\n" + "\n".join(bad)


def test_the_layer_check_sees_an_upward_import():
    graph = {
        "commrt.runtime.store": {"commrt.collectives.core"},
        "commrt.sync.x": {"commrt.runtime.a"},
    }
    assert layer_violations(graph) == [
        "commrt.runtime.store (runtime) imports commrt.collectives.core (collectives)"
    ]


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


# ------------------------------------------------------------ algorithms are schedules
#: what algorithms/ may not import, lazily or not: the simulator prices them, the runtime
#: runs them, and the layers above call their hooks (commrt.tuning.hook_comm hands down what
#: those hooks need of the communicator)
ABOVE_ALGORITHMS = (
    "commrt.sim",
    "commrt.process",
    "commrt.diagnosis",
    "commrt.runtime",
    "commrt.collectives",
    "commrt.tuning",
    "commrt.sync",
    "commrt.distributed",
)


def _imported_names(name: str, tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """Every dotted name an import statement in ``tree`` names, with the statement."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, node)
            out += [(base, node)] + [(f"{base}.{a.name}", node) for a in node.names]
    return out


def test_algorithms_import_neither_the_simulator_nor_the_layers_above():
    hits = sorted(
        {
            f"{_where(name, node)}: imports {target}"
            for name, tree in TREES.items()
            if name == "commrt.algorithms" or name.startswith("commrt.algorithms.")
            for target, node in _imported_names(name, tree)
            if any(target == up or target.startswith(up + ".") for up in ABOVE_ALGORITHMS)
        }
    )
    assert not hits, "algorithms/ imports what sits above it:\n" + "\n".join(hits)


def _declared_hooks() -> set[str]:
    """What :class:`commrt.algorithms.Algorithm` declares: its methods and attributes."""
    (cls,) = [
        n
        for n in TREES["commrt.algorithms.base"].body
        if isinstance(n, ast.ClassDef) and n.name == "Algorithm"
    ]
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("__")}


HOOKS = _declared_hooks()
#: names that hold an algorithm (``alg``, ``self.algorithm``, ``inner_alg``, ``dc.algorithm``)
ALGORITHM_NAMES = ("alg", "algorithm", "algo")


def _discoveries(tree: ast.AST, hooks: set[str]) -> list[ast.Call]:
    """``getattr(alg, "...")`` / ``hasattr(alg, "...")`` with a string literal, where the
    object is named like an algorithm or the literal names a hook ``Algorithm`` declares:
    a hook looked for instead of called."""
    hits = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            continue
        owner = node.args[0]
        owner_name = (
            owner.id
            if isinstance(owner, ast.Name)
            else owner.attr
            if isinstance(owner, ast.Attribute)
            else ""
        )
        stem = owner_name.lstrip("_").lower()
        named_like = any(stem == a or stem.endswith("_" + a) for a in ALGORITHM_NAMES)
        if named_like or node.args[1].value in hooks:
            hits.append(node)
    return hits


def test_algorithm_declares_every_hook_that_others_call():
    assert {"select", "observe", "settled_counter", "on_network", "sync_policy"} <= HOOKS
    assert {"family", "learns", "schedule", "supports", "name"} <= HOOKS


def test_nobody_discovers_an_algorithm_hook_with_getattr():
    hits = [
        f"{_where(name, node)}: {ast.unparse(node)}"
        for name, tree in TREES.items()
        for node in _discoveries(tree, HOOKS)
    ]
    assert not hits, (
        "algorithm hooks looked up instead of called (declare them on Algorithm):\n"
        + "\n".join(hits)
    )


@pytest.mark.parametrize(
    "source,found",
    [
        ('observe = getattr(alg, "observe", None)', 1),
        ('price = getattr(algorithm, "closed_form", None)', 1),
        ('offer = getattr(self.algorithm, "sync_policy", None)', 1),
        ('hasattr(inner_alg, "on_network")', 1),
        ('getattr(x, "settled_counter")', 1),
        ('getattr(comm, "local_size", None)', 0),
        ("getattr(alg, name)", 0),
        ("alg.observe(comm, 1, 0.0)", 0),
    ],
)
def test_the_hook_discovery_check_sees_what_it_should(source, found):
    assert len(_discoveries(ast.parse(source), HOOKS)) == found


def test_the_import_check_sees_lazy_imports():
    tree = ast.parse(
        "def f():\n    from commrt.sim.pricing import ring_time\n    import commrt.tuning\n"
    )
    names = [t for t, _ in _imported_names("commrt.algorithms.ring", tree)]
    assert "commrt.sim.pricing" in names and "commrt.tuning" in names


# ------------------------------------------------------------ declare, don't discover
#: (module, attribute) -> why a ``getattr``/``hasattr`` with that literal may stay: each
#: asks an object that is not commrt's, which declares nothing commrt could call plainly
DISCOVERY_ALLOWED = {
    ("commrt.distributed.dispatch", "asyncOp"): "torch's options object: older torch lacks it",
    ("commrt.distributed.register", "PartialState"): "accelerate's module, by version",
    ("commrt.distributed.register", "_shared_state"): "accelerate's PartialState's own",
    ("commrt", "register"): "whether commrt.distributed.register's import is still under way",
}


def capability_lookups(tree: ast.AST) -> list[ast.Call]:
    """``getattr(x, "name"[, default])`` and ``hasattr(x, "name")`` with a string literal:
    a capability found by name instead of declared on the interface that owns it. Python's
    own dunders (``__dict__``) and a name held in a variable (a dataclass walking its own
    fields) are not looked for."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and not node.args[1].value.startswith("__")
    ]


def test_nobody_discovers_a_capability_with_getattr():
    hits = [
        f"{_where(name, node)}: {ast.unparse(node)}"
        for name, tree in TREES.items()
        for node in capability_lookups(tree)
        if (name, node.args[1].value) not in DISCOVERY_ALLOWED
    ]
    assert not hits, (
        "capabilities looked up by name (declare them on the interface that owns them, "
        "or add the entry and its reason to DISCOVERY_ALLOWED):\n" + "\n".join(hits)
    )


def test_every_allowed_discovery_is_still_there():
    """An entry whose lookup went away is dropped, so the list stays short."""
    found = {
        (name, node.args[1].value)
        for name, tree in TREES.items()
        for node in capability_lookups(tree)
    }
    assert set(DISCOVERY_ALLOWED) <= found, set(DISCOVERY_ALLOWED) - found


#: source -> the names :func:`capability_lookups` finds in it
LOOKUPS_SEEN = {
    'store = getattr(comm.transport, "store", None)': ["store"],
    'if hasattr(self.nccl, "HostStream"): pass': ["HostStream"],
    'getattr(args, "run", None) is None': ["run"],
    "getattr(self, f)": [],
    'getattr(o, "__dict__", str(o))': [],
    "comm.transport.store": [],
}


@pytest.mark.parametrize("source", LOOKUPS_SEEN)
def test_the_capability_check_sees_what_it_should(source):
    found = [n.args[1].value for n in capability_lookups(ast.parse(source))]
    assert found == LOOKUPS_SEEN[source]


# ------------------------------------------------------------ no private reach across modules
def private_owner(dotted: str) -> str | None:
    """The package or module a dotted name is private to, or None if it is public: the
    scope that holds its first underscored part (``commrt.process.rendezvous._bcast`` is
    private to ``commrt.process.rendezvous``; ``commrt.kernels._common.check`` to
    ``commrt.kernels``, since all of a private module belongs to its package)."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def private_imports(name: str, tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(statement, dotted name) for each project name ``name`` imports that is private to
    a scope ``name`` is not inside."""
    hits = []
    for dotted, node in _imported_names(name, tree):
        if isinstance(node, ast.ImportFrom) and dotted == _resolve(name, node):
            continue  # the module a from-import names, counted with each name it takes
        owner = private_owner(dotted)
        if dotted.split(".")[0] not in ("commrt",) or owner is None:
            continue
        if not (name == owner or name.startswith(owner + ".")):
            hits.append((node, dotted))
    return hits


def test_nobody_imports_another_modules_private_names():
    hits = [
        f"{_where(name, node)}: {dotted}"
        for name, tree in TREES.items()
        for node, dotted in private_imports(name, tree)
    ]
    assert not hits, (
        "private names imported across modules (make them public, or move them to where "
        "both use them):\n" + "\n".join(hits)
    )


@pytest.mark.parametrize(
    "importer,source,found",
    [
        (
            "commrt.diagnosis.stall",
            "from commrt.process.rendezvous import _bcast_text, serve",
            ["commrt.process.rendezvous._bcast_text"],
        ),
        (
            "commrt.cli.simulate_deadline",
            "from .simulate_sections import _fmt_time",
            ["commrt.cli.simulate_sections._fmt_time"],
        ),
        ("commrt.sync.x", "from commrt.kernels import _torch", ["commrt.kernels._torch"]),
        ("commrt.sync.x", "import commrt.kernels._torch", ["commrt.kernels._torch"]),
        ("commrt.kernels.pack", "from commrt.kernels import _torch", []),
        ("commrt.kernels._triton", "from commrt.kernels._kernels import _pack", []),
        ("commrt.sync.x", "from torch._C import Work", []),
        ("commrt.sync.x", "from commrt.runtime import rows as _rows", []),
    ],
)
def test_the_private_import_check_sees_what_it_should(importer, source, found):
    hits = private_imports(importer, ast.parse(source))
    assert [dotted for _, dotted in hits] == found


# -- no transport or backend told by its name

#: the names transports and backends go by
NAMES = {"mpi", "gloo", "shm", "nccl", "cuda_ipc"}


def names_compared(source: str) -> int:
    """How many comparisons (``==``, ``!=``, ``in``) hold a transport's or backend's name
    as a string literal."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literals = [
            e.value
            for side in sides
            for e in (side.elts if isinstance(side, (ast.Tuple, ast.Set, ast.List)) else [side])
            if isinstance(e, ast.Constant)
        ]
        count += any(v in NAMES for v in literals)
    return count


def outside_the_chooser(count) -> dict[str, int]:
    """Each library module but the transport chooser (runtime/choice.py) where ``count`` of
    its source is not 0, with that count."""
    found = {}
    for _, path in library_sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel != "commrt/runtime/choice.py" and (n := count(path.read_text("utf-8"))):
            found[rel] = n
    return found


def test_the_name_check_sees_a_comparison():
    assert names_compared('if t.name == "gloo" or b in ("mpi", "cuda_ipc"): pass') == 2
    assert names_compared('if t.traits.survives_peer_death and x == "ring": pass') == 0


def test_no_transport_is_told_by_its_name():
    """What a transport is, it declares (a trait on Transport, asked as NCCL asks each
    transport canConnect); runtime/choice.py alone maps names to backends."""
    assert outside_the_chooser(names_compared) == {}


def members_named(source: str) -> int:
    """How many times ``source`` names a member of ``Backend`` (``Backend.GLOO``): each is a
    comparison or a dispatch on one backend, which only its row may make."""
    return sum(
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Backend"
        and node.attr.isupper()
        for node in ast.walk(ast.parse(source))
    )


def test_the_member_check_sees_a_backend_named():
    assert members_named("if be is Backend.GLOO or b in {Backend.MPI}: pass") == 2
    assert members_named("if be.takes_a_replacement and Backend(name): pass") == 0


def test_no_backend_is_named_outside_its_table():
    """A backend is one row of ``ORDER`` in runtime/choice.py: every caller reads the row
    (its traits, where it fits, how it is made), and none names a member to compare with."""
    assert outside_the_chooser(members_named) == {}


def _thread_sites() -> list[tuple[str, ast.Call, str | None, object]]:
    """Every ``threading.Thread(...)`` / ``threading.Timer(...)`` the library makes, as
    (module, call, its name's fixed part, its daemon flag): the name from ``name=`` (an
    f-string's leading text) or a later ``X.name = "..."`` in the same function; the flag
    from ``daemon=`` or a later ``X.daemon = ...`` there (None: neither)."""

    def text(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.JoinedStr) and isinstance(node.values[0], ast.Constant):
            return node.values[0].value
        return None

    sites = []
    for mod, tree in TREES.items():
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            later = {}  # attribute assignments in this function: "name"/"daemon" -> value
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
                    pairs = zip(node.targets[0].elts, getattr(node.value, "elts", []))
                elif isinstance(node, ast.Assign):
                    pairs = [(node.targets[0], node.value)]
                else:
                    continue
                for target, value in pairs:
                    if isinstance(target, ast.Attribute) and target.attr in ("name", "daemon"):
                        later[target.attr] = value
            for node in ast.walk(fn):
                f = node.func if isinstance(node, ast.Call) else None
                is_thread = isinstance(f, ast.Attribute) and f.attr in ("Thread", "Timer")
                if not (is_thread and getattr(f.value, "id", None) == "threading"):
                    continue
                kw = {k.arg: k.value for k in node.keywords}
                name = text(kw.get("name", later.get("name")))
                flag = kw.get("daemon", later.get("daemon"))
                sites.append((mod, node, name, getattr(flag, "value", flag)))
    return sites


def test_every_thread_follows_the_thread_rule_or_is_a_named_exemption():
    # commrt.process.threads: a thread beside the program is a background_thread (not a
    # daemon); a daemon is one of DAEMONS, whose reason says why
    from commrt.process.threads import DAEMONS, daemon_reason

    sites = _thread_sites()
    assert len(sites) >= 6, sites  # background_thread's, and the daemons'
    used = set()
    for mod, call, name, daemon in sites:
        where = _where(mod, call)
        if mod == "commrt.process.threads":
            assert daemon is False, f"{where}: background_thread makes a non-daemon"
            continue
        assert daemon is True, f"{where}: a thread not made by background_thread is a daemon"
        assert name is not None and daemon_reason(name), (
            f"{where}: daemon thread {name!r} is not one of commrt.process.threads.DAEMONS"
        )
        used |= {k for k in DAEMONS if name == k or (k.endswith("-") and name.startswith(k))}
    assert used == set(DAEMONS), f"exemptions no thread has: {set(DAEMONS) - used}"


def test_the_thread_rule_check_finds_an_unlisted_daemon():
    tree = ast.parse(
        "import threading\n"
        "def f():\n"
        "    threading.Thread(target=f, name=f'commrt-x{1}', daemon=True).start()\n"
        "    t = threading.Timer(1, f)\n"
        "    t.daemon, t.name = True, 'commrt-startup-note'\n"
    )
    TREES["probe"] = tree
    try:
        found = {(n, d) for m, _, n, d in _thread_sites() if m == "probe"}
    finally:
        del TREES["probe"]
    from commrt.process.threads import daemon_reason

    assert found == {("commrt-x", True), ("commrt-startup-note", True)}
    assert daemon_reason("commrt-x") is None and daemon_reason("commrt-startup-note")
    assert daemon_reason("commrt-bounded-nccl-abort") and daemon_reason("commrt-bounded") is None
