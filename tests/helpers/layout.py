"""The tree's layout, read from the one place that declares it.

pyproject.toml's ``[tool.setuptools.package-dir]`` maps each source folder to
the import package it installs as (``kernels/`` -> ``commrt.kernels``);
setup.py installs every package folder under them. The tests that scan the
library's source read the map from here, never from a copy of it.
"""

from __future__ import annotations

import pathlib
import tomllib
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
#: source folder -> the import package it installs as
PACKAGES = {
    folder: package for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()
}


def library_sources() -> Iterator[tuple[str, pathlib.Path]]:
    """(dotted module name, path) of every library source file, in a fixed order."""
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            yield ".".join((package, *parts)), path


def package_folders() -> dict[str, pathlib.Path]:
    """Dotted package name -> folder, for every folder of the library with an
    ``__init__.py``: what a wheel must hold."""
    return {name: path.parent for name, path in library_sources() if path.name == "__init__.py"}
