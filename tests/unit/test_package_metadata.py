"""What a package index shows of commrt: authors, classifiers, and a readme whose links
are not dead there.

A package index shows the readme alone, without the tree its relative links point into;
setup.py gives the metadata README.md with each of them as a path or as text. The test
builds a source distribution from a copy of the tree and reads its metadata.
"""

from __future__ import annotations

import email
import importlib.util
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib

import pytest
from helpers.layout import PACKAGES, PYPROJECT, ROOT

#: a Markdown link or image whose target has no scheme, or an HTML one
RELATIVE = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)[^)]*\)|(?:href|src)=\"(?![a-z]+:)", re.I)


def _setup_module():
    spec = importlib.util.spec_from_file_location("commrt_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() runs only as the build runs the file
    return module


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """The metadata (PKG-INFO) and the file names of an sdist built from a copy of the tree."""
    pytest.importorskip("build", reason="the dev extra's build")
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("dist")
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in", "mkdocs.yml"):
        shutil.copy(ROOT / name, tree / name)
    for folder in [*PACKAGES, "docs"]:
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    # the setuptools already installed builds it: no download, and seconds, not a minute
    cmd = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(out), str(tree)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (archive,) = out.glob("commrt-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
        info = tar.extractfile(f"{tar.getnames()[0].split('/')[0]}/PKG-INFO").read()
    return email.message_from_bytes(info), names


def test_the_metadata_names_authors_and_classifiers(sdist):
    meta, _ = sdist
    assert meta["Author"] or meta["Author-email"]
    classifiers = meta.get_all("Classifier")
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert "Topic :: System :: Distributed Computing" in classifiers


def test_the_python_classifiers_are_the_pythons_ci_runs():
    """A version classifier is a claim: each names a Python that .ci/matrix.toml runs, and
    each Python it runs has one."""
    matrix = tomllib.loads((ROOT / ".ci/matrix.toml").read_text("utf-8"))
    runs = [matrix["suite"], matrix["wheel"], *matrix["torch_facing"]["run"]]
    tested = {run["python"] for run in runs}
    versions = re.compile(r"Programming Language :: Python :: (3\.\d+)")
    claimed = {m[1] for c in PYPROJECT["project"]["classifiers"] if (m := versions.fullmatch(c))}
    assert claimed == tested, f"classifiers {sorted(claimed)}, CI runs {sorted(tested)}"


def test_the_readme_an_index_shows_has_no_relative_link(sdist):
    meta, names = sdist
    readme = meta.get_payload()
    assert "pip install torch==2.13.0 && pip install -e '.[train]' && commrt train" in readme
    assert not RELATIVE.findall(readme), RELATIVE.findall(readme)[:5]
    # the paths it names instead travel with it
    named = set(re.findall(r"`(docs/[\w./-]+\.md)`", readme))
    assert "docs/install.md" in named
    assert sorted(n for n in named if n not in names) == []


def test_links_into_the_tree_become_paths_and_links_to_headings_text():
    index_readme = _setup_module().index_readme
    text = (
        "See [docs/a.md](docs/a.md), [the guide](docs/b.md#part), [below](#on-a-gpu), "
        "[docs/c.md](docs/c.md#x), <https://ui.perfetto.dev> and [site](https://x.org/a)."
    )
    assert index_readme(text) == (
        "See `docs/a.md`, the guide (`docs/b.md`), below, `docs/c.md`, "
        "<https://ui.perfetto.dev> and [site](https://x.org/a)."
    )
