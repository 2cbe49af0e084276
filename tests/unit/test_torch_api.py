"""commrt's reach into torch beyond its collectives stays in one module, and clear of the
names torch owns.

:mod:`commrt.distributed.torch_api` is the one module that subclasses torch's classes'
bases, registers the backend and reads ``torch._C``. A Work subclass of commrt's keeps its
state under one attribute of its own: torch 2.14 made ``Work.timeout`` a read-only
property, and every DDP construction on "commrt" failed on the old ``self.timeout``.
"""

from __future__ import annotations

import ast
import tomllib

import torch
from helpers.layout import ROOT, library_sources

from commrt.distributed import torch_api
from commrt.distributed.work import CommrtWork, P2PWork

#: what a Work subclass overrides on purpose: the calls torch and DDP make on a work
OVERRIDDEN = {"wait", "get_future", "is_completed", "is_success", "exception"}


class _Done:
    """An exchange already complete, for a P2PWork."""

    def complete(self) -> None:
        pass


def _works():
    t = [torch.zeros(2)]
    return [CommrtWork("allreduce on cpu", 0, t, 5.0), P2PWork("send on cpu", 0, t, 5.0, _Done())]


def test_a_work_keeps_its_state_under_its_one_name():
    for work in _works():
        assert set(vars(work)) == {torch_api.WORK_STATE}, type(work).__name__


def test_a_work_defines_no_name_of_torch_s_but_what_it_overrides():
    owned = torch_api.names_torch_owns()
    assert {"wait", "get_future"} <= owned  # the list is torch's, not empty
    ours = {
        name
        for cls in (CommrtWork, P2PWork)
        for name in vars(cls)
        if not (name.startswith("__") and name.endswith("__"))
    }
    assert (ours & owned) - OVERRIDDEN == set(), f"torch {torch.__version__}'s Work has these"


def test_a_work_completes_and_fails_as_torch_expects():
    work, p2p = _works()
    work.finish()
    assert work.wait() and work.is_completed() and work.is_success()
    assert work.get_future().wait() is work.commrt.result
    assert p2p.wait() and p2p.is_success()


def _reaches(tree: ast.AST) -> list[str]:
    """``torch._C`` and the torch classes a module subclasses or registers with."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("_C", "register_backend"):
            hits.append(node.attr)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch._C"):
            hits.append(node.module)
        if isinstance(node, ast.ClassDef):
            hits += [
                ast.unparse(b)
                for b in node.bases
                if ast.unparse(b).endswith(("dist.Work", "dist.ProcessGroup"))
            ]
    return hits


def test_only_torch_api_reaches_into_torch():
    outside = {
        name: hits
        for name, path in library_sources()
        if name != torch_api.__name__ and (hits := _reaches(ast.parse(path.read_text("utf-8"))))
    }
    assert not outside, f"reaches into torch outside {torch_api.__name__}: {outside}"
    assert _reaches(ast.parse("class W(dist.Work): pass\nx = torch._C.f()"))


def test_the_versions_torch_api_names_are_the_ones_ci_runs():
    matrix = tomllib.loads((ROOT / ".ci" / "matrix.toml").read_text("utf-8"))
    ran = {matrix[step]["torch"] for step in ("suite", "wheel")}
    ran |= {r["torch"] for r in matrix["torch_facing"]["run"]}
    doc = " ".join(torch_api.__doc__.split())
    said = doc.split("Tested on torch ", 1)[1].split(":", 1)[0]
    assert sorted(ran) == sorted(said.replace(" and ", ", ").split(", "))
