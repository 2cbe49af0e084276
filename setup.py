"""The packages to install, found in the tree rather than listed by hand.

pyproject.toml's ``[tool.setuptools.package-dir]`` is the one place that maps
folders to import packages (``kernels/`` installs as ``commrt.kernels``); every
folder under a mapped one that holds an ``__init__.py`` is a subpackage of it.
A new package folder is therefore in the wheel without anyone listing it.
Everything else about the build is declared in pyproject.toml.
"""

import pathlib
import tomllib

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
    "package-dir"
]

setup(
    packages=[
        found
        for name, folder in PACKAGE_DIRS.items()
        for found in (name, *(f"{name}.{sub}" for sub in find_packages(str(ROOT / folder))))
    ]
)
