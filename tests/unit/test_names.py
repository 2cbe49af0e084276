"""One name per meaning, for the words that used to carry several.

"watch" is the stall watch alone (:mod:`commrt.diagnosis.stall`); the NCCL
watchdog guards calls (:mod:`commrt.transports.watchdog`). What else once said
watch has a name of its own: the communicator's ``departures``, backup
liveness checking a neighbour, the waits given up once a peer is recorded dead
(``sync/backup/waiter.py``), a settled size's ``settled_counter``. And no class
is named bare ``Context``. Pure ast over the source, as tests/unit/test_house.py.
"""

from __future__ import annotations

import ast

import pytest
from helpers.layout import ROOT, library_sources

#: identifiers that may say "watch", and where: the stall watch, the watchdog, and the
#: old name of RankDeclaredDeadError.declared_by kept for code that reads it
ALLOWED = {
    "StallWatch": {"commrt/diagnosis/stall.py"},
    "start_watch": {
        "commrt/diagnosis/stall.py",
        "commrt/runtime/communicator.py",
        "commrt/distributed/devices.py",
    },
    "watch": {
        "commrt/diagnosis/stall.py",
        "commrt/diagnosis/hearing.py",
        "commrt/process/elastic.py",
    },
    "Watchdog": {"commrt/transports/watchdog.py", "commrt/transports/nccl.py"},
    "watchdog": {"commrt/transports/nccl.py"},
    "watcher": {"commrt/sync/backup/liveness.py"},
}


def identifiers(tree: ast.AST):
    """(name, line) of every identifier ``tree`` defines or uses: classes, functions,
    arguments, attributes, names, imported names and the modules imported from."""
    for n in ast.walk(tree):
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield n.name, n.lineno
        elif isinstance(n, ast.arg):
            yield n.arg, n.lineno
        elif isinstance(n, ast.Attribute):
            yield n.attr, n.lineno
        elif isinstance(n, ast.Name):
            yield n.id, n.lineno
        elif isinstance(n, ast.ImportFrom) and n.module:
            yield n.module.rsplit(".", 1)[-1], n.lineno
        elif isinstance(n, ast.alias):
            yield n.name.rsplit(".", 1)[-1], 0
            if n.asname:
                yield n.asname, 0


def stray_watches(source: str, where: str) -> list[str]:
    """The identifiers in ``source`` (the file ``where``) that say watch outside
    :data:`ALLOWED`."""
    return [
        f"{where}:{line} {name}"
        for name, line in identifiers(ast.parse(source))
        if "watch" in name.lower() and where not in ALLOWED.get(name, ())
    ]


def _sources():
    for _, path in library_sources():
        yield str(path.relative_to(ROOT)), path.read_text()


def test_watch_names_the_stall_watch_alone():
    stray = [s for where, source in _sources() for s in stray_watches(source, where)]
    assert not stray, "a 'watch' that is not the stall watch or the watchdog:\n" + "\n".join(stray)


def test_no_class_is_named_bare_context():
    bare = [
        f"{where}:{n.lineno}"
        for where, source in _sources()
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == "Context"
    ]
    assert not bare, f"a class named Context (say what it is a context of): {bare}"


@pytest.mark.parametrize(
    "source,where,found",
    [
        ("self.watch = Departures(transport)", "commrt/runtime/communicator.py", 1),
        ("def attach_watch(self, w): pass", "commrt/transports/base.py", 1),
        ("from commrt.sync.backup.watched import WaiterSlot", "commrt/sync/backup/x.py", 1),
        ("class Watch: pass", "commrt/transports/watchdog.py", 1),
        ("w = StallWatch(client)", "commrt/diagnosis/stall.py", 0),
        ("self.watchdog = Watchdog()", "commrt/transports/nccl.py", 0),
        ("s = 'the stall watch'  # a watch in words", "commrt/sync/policy.py", 0),
    ],
)
def test_the_watch_check_sees_what_it_should(source, where, found):
    assert len(stray_watches(source, where)) == found
