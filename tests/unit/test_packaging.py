"""The wheel holds every module of the tree, a package folder added tomorrow included.

setup.py finds the packages under each folder of pyproject.toml's package-dir, so no list
can fall behind the tree (a hand-kept one once left out ``commrt.sync.gossip``, and a
built wheel could not ``import commrt``). This builds a wheel from a copy of the tree with
two new package folders in it, one under a mapped folder, and reads what it holds.
CI also installs a wheel of the real tree and uses it (tools/ci_matrix.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from ci_matrix import tree_modules  # tools/ (tests/conftest.py puts it on the path)
from helpers.layout import PACKAGES, ROOT

#: what a build reads besides the package folders
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")


def _wheel_of(tree, out) -> set[str]:
    cmd = [sys.executable, "-m", "build", "--wheel", "-o", str(out), str(tree)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("commrt-*.whl")
    return {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}


def test_a_wheel_holds_every_module_and_every_new_package(tmp_path):
    tree = tmp_path / "tree"
    for name in BUILD_FILES:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tree / name)
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    new = [tree / "commrt" / "newroom" / "inner", tree / "kernels" / "newkind"]
    for folder in new:
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text('"""A package folder nobody listed."""\n')
        (folder.parent / "__init__.py").touch()
    want = tree_modules(tree)  # what CI's wheel step holds the real tree's wheel to
    held = _wheel_of(tree, tmp_path / "dist")
    assert "commrt/kernels/newkind/__init__.py" in want
    assert sorted(want - held) == [], "modules of the tree the wheel lacks"
    assert sorted(held - want) == [], "modules in the wheel that the tree lacks"
