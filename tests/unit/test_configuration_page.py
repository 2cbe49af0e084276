"""Every setting is declared once (commrt.settings): each ``COMMRT_*`` variable in
``VARIABLES``, each module-level ``*_S`` bound as a ``Seconds`` beside its use; and
docs/configuration.md is what tools/configuration_page.py writes from the declarations.

The library's side is a scan of its source (commrt/, algorithms/, kernels/), so a variable
named without a declaration, or a bound kept as a bare number, fails here.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from helpers.layout import library_sources

from commrt import settings

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
VARIABLE = re.compile(r"\bCOMMRT_[A-Z][A-Z0-9_]*\b")
BOUND = re.compile(r"^[A-Z][A-Z0-9_]*_S$")
DECLARATIONS = ROOT / "commrt" / "settings.py"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "configuration_page", ROOT / "tools" / "configuration_page.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def undeclared(source: str) -> set[str]:
    """The ``COMMRT_*`` names ``source`` mentions that no declaration has."""
    return set(VARIABLE.findall(source)) - {v.name for v in settings.VARIABLES}


def names_spelt_out(source: str) -> set[str]:
    """String constants and keyword arguments of ``source`` that are a variable's bare
    name: how a read or a write looks (``os.environ.get("COMMRT_X")``,
    ``dict(env, COMMRT_X="1")``) where it does not go through the declaration."""
    tree = ast.parse(source)
    constants = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    keywords = {node.arg for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg}
    return {name for name in constants | keywords if re.fullmatch(VARIABLE, name)}


def bounds_kept() -> set[str]:
    """``module.NAME`` of every module-level ``*_S`` constant in the source."""
    found = set()
    for module, path in library_sources():
        for node in ast.parse(path.read_text("utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            targets = [node.target] if isinstance(node, ast.AnnAssign) else targets
            for t in targets:
                names = t.elts if isinstance(t, ast.Tuple) else [t]
                found |= {f"{module}.{n.id}" for n in names if isinstance(n, ast.Name)}
    return {name for name in found if BOUND.match(name.rsplit(".", 1)[1])}


def test_the_scans_see_what_they_look_for():
    assert undeclared('x = os.environ.get("COMMRT_NEW_KNOB")') == {"COMMRT_NEW_KNOB"}
    assert undeclared("f'{settings.DEBUG.name}=1, as COMMRT_DEBUG=1 says'") == set()
    assert names_spelt_out('os.environ.get("COMMRT_DEBUG", "")') == {"COMMRT_DEBUG"}
    assert names_spelt_out('"set COMMRT_DEBUG=1 to check"') == set()  # a message
    assert names_spelt_out('start(rank, COMMRT_REJOIN="1")') == {"COMMRT_REJOIN"}
    assert "commrt.process.rendezvous.DEFAULT_TIMEOUT_S" in bounds_kept()
    assert "commrt.algorithms.auto_learn.RECHECK_S" in bounds_kept()  # algorithms/ installed


def test_every_variable_the_library_names_is_declared():
    found = {str(path): undeclared(path.read_text("utf-8")) for _, path in library_sources()}
    assert {p: n for p, n in found.items() if n} == {}


def test_a_variable_is_read_through_its_declaration_only():
    found = {
        str(path.relative_to(ROOT)): names_spelt_out(path.read_text("utf-8"))
        for _, path in library_sources()
        if path != DECLARATIONS
    }
    assert {p: n for p, n in found.items() if n} == {}


def test_every_bound_is_declared_as_seconds_with_its_meaning():
    declared = dict(_tool().bounds())  # raises naming any *_S kept as a bare number
    assert set(declared) == bounds_kept()
    for name, bound in declared.items():
        assert isinstance(bound, settings.Seconds) and bound.help and bound.applies, name
        assert bound.group in settings.GROUPS, name


def test_a_bound_in_no_group_is_refused():
    import pytest

    with pytest.raises(ValueError, match="group 'Misc' is not one of"):
        settings.Seconds(1.0, "help", "applies", "Misc")


def test_the_page_is_written_from_the_declarations():
    assert PAGE.read_text("utf-8") == _tool().render(), (
        "docs/configuration.md differs from the declarations: run "
        "python tools/configuration_page.py"
    )


def test_the_variables_the_launcher_sets_are_marked_so():
    internal = {v.name for v in settings.VARIABLES if v.set_by}
    assert {"COMMRT_LAUNCHED", "COMMRT_LAUNCHED_AT", "COMMRT_PEER_REPORTS"} <= internal
    assert "COMMRT_RANK_FROM_MPI" in internal
    text = PAGE.read_text("utf-8")
    yours = text.split("## Environment variables you set", 1)[1].split("\n## ", 1)[0]
    assert not any(f"`{name}`" in yours for name in internal)


def test_flag_variables_read_as_the_page_says():
    import pytest

    assert settings.DEBUG.get({"COMMRT_DEBUG": "detail"}) is True
    assert settings.DEBUG.get({"COMMRT_DEBUG": " Off "}) is False
    assert settings.DEBUG.get({}) is False and settings.ABORT_ON_ERROR.get({}) is True
    assert settings.REJOIN.get({}) is None  # no default: the reader decides
    with pytest.raises(ValueError, match="COMMRT_DEBUG='maybe': use 1 or 0"):
        settings.DEBUG.get({"COMMRT_DEBUG": "maybe"})


def test_each_kind_reads_validates_and_holds_its_default():
    """A declaration parses its variable and checks it, naming the variable, and the page's
    default is written from the same value the code uses where the variable is unset."""
    import pytest

    from commrt.transports import cuda_ipc, cuda_ipc_host

    slot, host = settings.CUDA_IPC_SLOT_BYTES, settings.CUDA_IPC_HOST_BYTES
    assert slot.get({}) == cuda_ipc.SLOT_BYTES == 4 << 20 and slot.default_words == "4 MiB"
    assert host.get({}) == cuda_ipc_host.HOST_BYTES == 1 << 20 and host.default_words == "1 MiB"
    assert slot.get({slot.name: "4096"}) == 4096 and host.get({host.name: "0"}) == 0
    for bad in ("8", "4097", "0", "-16", "4 MiB"):
        with pytest.raises(ValueError, match=f"{slot.name} must be a positive multiple of 16"):
            slot.get({slot.name: bad})
    with pytest.raises(ValueError, match=f"{host.name} must be a number of bytes, 0 or more"):
        host.get({host.name: "-1"})

    log, traceback = settings.LOG, settings.TRACEBACK
    assert log.get({}) is None and log.get({log.name: " INFO "}) == "info"
    assert log.get({log.name: "none"}) == "off"  # an alias
    with pytest.raises(ValueError, match="COMMRT_LOG='loud' is none of off, info, debug"):
        log.get({log.name: "loud"})
    assert traceback.get({}) == "short" and traceback.kind == "`short` or `full`"

    stall = settings.STALL
    assert stall.get({}) is None and stall.get({stall.name: "off"}) == 0.0
    assert stall.get({stall.name: "90"}) == 90.0 and stall.read("1.5") == 1.5
    with pytest.raises(ValueError, match="COMMRT_STALL_S='soon': give seconds"):
        stall.get({stall.name: "soon"})
    with pytest.raises(ValueError, match="COMMRT_STALL_S must be positive seconds"):
        stall.read("-3")
    assert settings.bytes_text(16) == "16 B" and settings.bytes_text(3 << 30) == "3 GiB"


def test_a_bound_is_its_float_wherever_it_goes():
    import copy
    import pickle

    bound = settings.Seconds(2.5, "help", "applies", settings.POLLING)
    assert bound == 2.5 and bound * 2 == 5.0 and f"{bound:g}" == "2.5"
    for copied in (pickle.loads(pickle.dumps(bound)), copy.deepcopy(bound)):
        assert type(copied) is float and copied == 2.5


# ------------------------------------------------------------------ no bare time bounds
#: a parameter or keyword that takes seconds: a timeout, a deadline, seconds, ``*_s``
#: (not a rate: ``gbytes_per_s``)
SECONDS_PARAM = re.compile(r"timeout|deadline|seconds|(?<!_per)_s$|^s$")
#: the standard library's calls whose first argument is seconds
SECONDS_FIRST = {"wait": {0}, "join": {0}, "sleep": {0}}


def _at_least_one_second(node: ast.AST) -> bool:
    """Whether ``node`` is a number of 1 or more written out (``300.0``, ``2 * 60``)."""
    kinds = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    if not all(isinstance(n, kinds) for n in ast.walk(node)):
        return False
    try:
        value = eval(compile(ast.Expression(node), "<bound>", "eval"))  # constants only
    except Exception:
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1


def seconds_positions(trees) -> dict[str, set[int]]:
    """For each function name the library defines, the positions (after ``self``) of its
    parameters that take seconds; with :data:`SECONDS_FIRST`."""
    found = {name: set(at) for name, at in SECONDS_FIRST.items()}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                names = names[1:] if names[:1] in (["self"], ["cls"]) else names
                at = {i for i, name in enumerate(names) if SECONDS_PARAM.search(name)}
                found.setdefault(node.name, set()).update(at)
    return found


def _callee(func: ast.AST) -> str | None:
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def bare_bounds(tree: ast.AST, positions: dict[str, set[int]]) -> list[int]:
    """The lines of ``tree`` where a number of 1 or more is passed as seconds (a keyword or
    a parameter that takes seconds, :func:`seconds_positions`) or added to the clock
    (``time.monotonic() + 300``): a bound that belongs in a ``Seconds`` declaration, or
    derived from the call's timeout."""
    clock = lambda n: isinstance(n, ast.Call) and _callee(n.func) in ("monotonic", "time")  # noqa: E731
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            named = [k.value for k in node.keywords if k.arg and SECONDS_PARAM.search(k.arg)]
            at = positions.get(_callee(node.func), ())
            given = named + [a for i, a in enumerate(node.args) if i in at]
            lines += [node.lineno for value in given if _at_least_one_second(value)]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            pairs = ((node.left, node.right), (node.right, node.left))
            lines += [node.lineno for a, b in pairs if clock(a) and _at_least_one_second(b)]
    return lines


@pytest.mark.parametrize(
    "source,found",
    [
        ("store.wait(keys, timeout=300.0)", 1),
        ("end = time.monotonic() + 30", 1),
        ("datetime.timedelta(seconds=2 * 60)", 1),
        ("def poll(done, timeout): ...\npoll(ready, 300.0)", 1),
        ("event.wait(5)", 1),
        ("store.wait(keys, timeout=STORE_CONNECT_S)", 0),
        ("poll(done, timeout, most_pause_s=0.05)", 0),
        ("Link.from_bandwidth(alpha_us=3.0, gbytes_per_s=370.0)", 0),
        ("time.sleep(GATHER_S + 2 * PRINTED_S + 5)", 0),
    ],
)
def test_the_bare_bound_scan_sees_what_it_should(source, found):
    tree = ast.parse(source)
    assert len(bare_bounds(tree, seconds_positions([tree]))) == found


def test_no_bare_time_bound_in_the_library():
    """Every time bound is a declared ``Seconds`` (with its meaning, on the configuration
    page) or derived from the call's timeout, never a number written at a call."""
    trees = {path: ast.parse(path.read_text("utf-8")) for _, path in library_sources()}
    positions = seconds_positions(trees.values())
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for path, tree in trees.items()
        for line in bare_bounds(tree, positions)
    }
    assert not found, "bare time bounds (declare a Seconds):\n" + "\n".join(sorted(found))
