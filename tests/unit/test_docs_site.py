"""The docs site builds (``mkdocs build --strict``) without commrt's dependencies, and its
API reference shows no reST and reads on a laptop and on a phone.

The docstrings cross-reference with Sphinx roles and introduce code with reST literal
blocks; ``docs/api/rest_markup.py`` (a Griffe extension) turns them into links and
fenced code. One build, into a temporary folder, with torch and numpy made unimportable
(the site reads the code without importing it, so ``docs/requirements.txt`` holds no
torch), then a scan of every page.
"""

from __future__ import annotations

import html
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


#: what commrt itself needs, which the docs build must not: an import of either fails there
BLOCKED = ("torch", "numpy")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs' requirements (docs/requirements.txt)")
    out = tmp_path_factory.mktemp("site")
    blocker = tmp_path_factory.mktemp("blocked")
    for name in BLOCKED:
        (blocker / name).mkdir()
        (blocker / name / "__init__.py").write_text(
            f"raise ImportError('the docs build imported {name}')\n"
        )
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=path)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def site(built):
    return {p.relative_to(built): p.read_text("utf-8") for p in built.rglob("*.html")}


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
    assert '<p>Example:</p>\n<div class="language-python highlight">' in page


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


def _module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_no_doctest_directive_shows_in_an_example(site):
    shown = {str(p): _text(t).count("doctest:") for p, t in site.items() if "doctest:" in _text(t)}
    assert not shown, f"'# doctest: ...' on the pages: {shown}"


def test_the_reference_shows_only_the_communicator_methods_a_user_page_names(site):
    """The API page's Communicator lists what users call: each member it shows is named on
    a page of the docs (or the README); the bookkeeping other modules call is left out."""
    page = site[Path("api/commrt/index.html")]
    shown = set(re.findall(r'id="commrt\.Communicator\.(\w+)"', page))
    assert {"barrier", "run_schedule", "close"} <= shown, shown
    pages = [p for p in (ROOT / "docs").glob("*.md")] + [ROOT / "README.md"]
    named = " ".join(p.read_text("utf-8") for p in pages)
    unnamed = sorted(m for m in shown if not re.search(rf"\b{m}\b", named))
    assert not unnamed, f"Communicator members on the API page that no user page names: {unnamed}"
    internal = {"note_op", "admit_collective", "syncs", "run_held", "check_open",
                "failed_in_call", "verdict_at_timeout"}  # fmt: skip
    assert not shown & internal, shown & internal


def test_a_default_that_names_a_constant_shows_its_value(site):
    """GradientSync(algorithm=DEFAULT_ALGORITHM) reads algorithm="ring" on the page, init's
    timeout its seconds: a reader cannot look a constant's name up from a signature."""
    signatures = re.findall(
        r'<div class="[^"]*doc-signature[^"]*">(.*?)</div>', "".join(site.values()), re.S
    )
    assert signatures
    named = sorted(
        {m for s in signatures for m in re.findall(r"=\s*([A-Z][A-Z0-9_]{3,})\b", _text(s))}
    )
    assert not named, f"signature defaults shown as a constant's name: {named}"
    text = _text(site[Path("api/commrt/index.html")])
    assert re.search(
        r"GradientSync\(.*?algorithm: \"str \| Algorithm\" = \"ring\"", " ".join(text.split())
    )


def test_init_has_a_parameter_table_with_every_parameter(site):
    import inspect

    import commrt

    page = site[Path("api/commrt/index.html")]
    section = page[page.index('id="commrt.init"') : page.index('id="commrt.Communicator"')]
    table = re.search(r"<table>.*?</table>", section, re.S)
    assert table, "init documents its parameters in a paragraph, not a table"
    first = r'<tr class="doc-section-item">\s*<td[^>]*>\s*<code>(.*?)</code>'
    rows = {_text(cell) for cell in re.findall(first, table.group(0))}
    assert rows == set(inspect.signature(commrt.init).parameters), rows


def test_table_code_breaks_after_dots_and_parentheses_never_inside_a_name():
    hook = _module("docs/hooks/table_code.py", "table_code")
    pieces = re.findall(
        r'<span class="nobr">(.*?)</span>', hook.wrap_code("commrt.init(debug=None)")
    )
    assert pieces == ["commrt.", "init(", "debug=", "None)"]
    assert re.findall(r'<span class="nobr">(.*?)</span>', hook.wrap_code("--max-restarts N")) == [
        "--max-restarts",
        "N",
    ]
    cell = hook.wrap_cells("<td><code>COMMRT_DEBUG</code></td><p><code>a.b</code></p>")
    assert (
        cell
        == '<td><code><span class="nobr">COMMRT_DEBUG</span><wbr></code></td><p><code>a.b</code></p>'
    )


#: a page of each kind, for the quick loop: API tables, tables of settings, code blocks
KINDS_OF_PAGE = ["api/commrt/index.html", "configuration/index.html", "quickstart/index.html"]


def test_in_a_real_browser_a_page_of_each_kind_reads_well(built):
    """As the whole-site check below, at 1280 pixels, on :data:`KINDS_OF_PAGE` only (a
    second each, where the whole site takes a minute): the check in the quick loop."""
    check = _module("tools/docs_check.py", "docs_check")
    browser = check.chromium()
    if browser is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium where apt-get can)")
    assert check.check(built, browser, only=KINDS_OF_PAGE) == []
    with pytest.raises(ValueError, match="no such page"):
        check.check(built, browser, only=["nowhere/index.html"])


@pytest.mark.slow
def test_in_a_real_browser_at_1280_px_no_name_breaks_no_line_hides_and_no_table_overflows(built):
    """tools/docs_check.py on every page, in headless Chromium: no name or flag in a table
    cell broken over two lines, no line of a code block under its copy button, no table
    wider than the page's column."""
    check = _module("tools/docs_check.py", "docs_check")
    browser = check.chromium()
    if browser is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium where apt-get can)")
    assert check.check(built, browser) == []


def _requirements(lines) -> list[str]:
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_the_docs_requirements_are_the_docs_extra_with_a_signature_formatter():
    """docs/requirements.txt (what CI's docs step installs, without commrt's own
    dependencies) is the ``docs`` extra, and both hold a formatter: without Black or Ruff
    mkdocstrings prints each signature on one cut-off line."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "optional-dependencies"
    ]["docs"]
    listed = _requirements((ROOT / "docs/requirements.txt").read_text("utf-8").splitlines())
    assert listed == extra
    assert {re.split(r"[<>=\[]", r)[0] for r in listed} & {"ruff", "black"}


def test_a_long_signature_is_laid_out_one_parameter_a_line(site):
    """Every signature longer than mkdocs.yml's line_length spans several lines, and init's
    puts each parameter on a line of its own (a formatter ran)."""
    import yaml

    config = yaml.load((ROOT / "mkdocs.yml").read_text("utf-8"), Loader=yaml.BaseLoader)
    (plugin,) = [p for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    limit = int(plugin["mkdocstrings"]["handlers"]["python"]["options"]["line_length"])
    signatures = [
        _text(s).strip()
        for page in site.values()
        for s in re.findall(r'<div class="[^"]*doc-signature[^"]*">(.*?)</div>', page, re.S)
    ]
    one_line = [s for s in signatures if "\n" not in s and len(s) > limit]
    assert not one_line, f"signatures on one line past {limit} characters: {one_line[:3]}"
    text = _text(site[Path("api/commrt/index.html")])
    init = text[text.index("init(") : text.index(") -> Communicator")]
    assert "\n    rank: int | None = None,\n    world_size: int | None = None,\n" in init


def test_api_table_cells_carry_their_column_names():
    hook = _module("docs/hooks/api_tables.py", "api_tables")
    table = (
        "<table><thead><tr><th>Name</th><th>Type</th></tr></thead><tbody>"
        '<tr class="doc-section-item"><td><code>a</code></td><td>int</td></tr></tbody></table>'
    )
    assert hook.on_page_content(f"<p>x</p>{table}<table><tr><td>1</td></tr></table>") == (
        "<p>x</p><table><thead><tr><th>Name</th><th>Type</th></tr></thead><tbody>"
        '<tr class="doc-section-item"><td data-label="Name"><code>a</code></td>'
        '<td data-label="Type">int</td></tr></tbody></table><table><tr><td>1</td></tr></table>'
    )


@pytest.mark.slow
def test_on_a_phone_no_api_table_scrolls_sideways_and_no_copy_button_covers_code(built):
    """tools/docs_check.py at 390 pixels, every page: the API tables fit the column (their
    cells stack, extra.css), no line of code runs under a copy button, and no name in a
    table cell is broken over two lines."""
    check = _module("tools/docs_check.py", "docs_check")
    browser = check.chromium()
    if browser is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium where apt-get can)")
    assert check.check(built, browser, check.PHONE) == []
