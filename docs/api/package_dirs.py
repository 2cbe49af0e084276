"""A Griffe extension for the API reference: packages that setuptools maps from other folders.

pyproject.toml's ``[tool.setuptools.package-dir]`` installs the folders
``kernels/`` and ``algorithms/`` as ``commrt.kernels`` and
``commrt.algorithms``. Griffe reads the source tree, where those folders are
not inside ``commrt/``, so it would not find them. When a package is loaded,
this extension loads each folder mapped under it as its subpackage, so the
reference can say ``::: commrt.algorithms.Ring`` as users import it.

The mapping is read from pyproject.toml, the one place that declares it (the
packaging and the tests read the same table). This file is build code for the
docs, not part of the library, and mkdocs.yml keeps it out of the site.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]


class PackageDirs(griffe.Extension):
    """Attach mapped folders to their parent package as Griffe loads it."""

    def __init__(self) -> None:
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
        mapped = pyproject["tool"]["setuptools"]["package-dir"]
        # only the packages whose folder is not where Griffe would look for them
        self.packages = {
            name: ROOT / folder
            for name, folder in mapped.items()
            if "." in name and Path(folder) != Path(*name.split("."))
        }

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        for name, folder in self.packages.items():
            parent, _, child = name.rpartition(".")
            if parent != pkg.path or child in pkg.members:
                continue
            # Griffe has no public call that loads a folder under a given parent module
            module = loader._load_module(child, folder / "__init__.py", parent=pkg)
            pkg.set_member(child, module)
