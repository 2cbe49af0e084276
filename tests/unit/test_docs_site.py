"""The docs site builds (``mkdocs build --strict``) and its API reference shows no reST.

The docstrings cross-reference with Sphinx roles and introduce code with reST literal
blocks; ``docs/api/rest_markup.py`` (a Griffe extension) turns them into links and
fenced code. One build, into a temporary folder, then a scan of every page.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# one worker runs the whole module under pytest-xdist: its tests read one built site
# (a module fixture)
pytestmark = pytest.mark.xdist_group("test_docs_site")

ROOT = Path(__file__).resolve().parents[2]
#: a role as mkdocstrings shows it when nothing rewrote it: ":class:<code>X</code>"
RAW_ROLE = re.compile(r":(?:py:)?(class|meth|func|mod|data|attr|exc|obj|const):(<code>|`)")
#: a literal block's marker shown as text
RAW_LITERAL = re.compile(r"Example::|::</p>")


def _extension():
    spec = importlib.util.spec_from_file_location("rest_markup", ROOT / "docs/api/rest_markup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {p.relative_to(out): p.read_text("utf-8") for p in out.rglob("*.html")}


def test_the_site_shows_no_raw_role_and_no_literal_block_marker(site):
    raw = {str(p): len(RAW_ROLE.findall(t)) for p, t in site.items() if RAW_ROLE.search(t)}
    literal = {
        str(p): len(RAW_LITERAL.findall(t)) for p, t in site.items() if RAW_LITERAL.search(t)
    }
    assert not raw, f"raw reST roles: {raw}"
    assert not literal, f"literal '::' blocks: {literal}"


def test_a_role_became_a_link_and_a_literal_block_code(site):
    page = site[Path("api/commrt/index.html")]
    link = re.search(
        r'Create a <a class="autorefs autorefs-internal"[^>]*><code>Communicator', page
    )
    assert link, "init's ':class:`Communicator`' is no link"
    assert '<p>Example:</p>\n<div class="highlight">' in page


def test_roles_become_optional_cross_references():
    ext = _extension()
    import griffe

    mod = griffe.Module("m")
    cls = griffe.Class("C", parent=mod)
    mod.set_member("C", cls)
    text = "See :class:`C`, :meth:`~a.b.C.run`, :mod:`x.y` and :data:`Z <a.Z>`."
    out = ext.ROLE.sub(lambda m: ext.cross_reference(m, mod), text)
    assert out == (
        'See <autoref identifier="m.C" optional><code>C</code></autoref>, '
        '<autoref identifier="a.b.C.run" optional><code>run()</code></autoref>, '
        '<autoref identifier="x.y" optional><code>x.y</code></autoref> and '
        '<autoref identifier="a.Z" optional><code>Z</code></autoref>.'
    )


def test_literal_blocks_become_fenced_code():
    ext = _extension()
    text = "Use it.\n\nExample::\n\n    >>> x = 1\n\n    >>> y = 2\n\nAfter.\nrun::\n\n    commrt probe\n"
    assert ext.fence_literal_blocks(text) == (
        "Use it.\n\nExample:\n\n```python\n>>> x = 1\n\n>>> y = 2\n```\n\nAfter.\nrun:\n\n"
        "```text\ncommrt probe\n```\n"
    )
    assert ext.fence_literal_blocks("a :: b\nno block::\nnext") == "a :: b\nno block::\nnext"
