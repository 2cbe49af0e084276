"""The packages to install, found in the tree rather than listed by hand, and the readme
a package index shows.

pyproject.toml's ``[tool.setuptools.package-dir]`` is the one place that maps
folders to import packages (``kernels/`` installs as ``commrt.kernels``); every
folder under a mapped one that holds an ``__init__.py`` is a subpackage of it.
A new package folder is therefore in the wheel without anyone listing it.

README.md links into the tree (``docs/install.md``), which works where the tree is shown
and is dead on a package index, which shows the readme alone; and the project has no
public home to point absolute links at. So the readme in the metadata is README.md with
each such link as its path in code (the docs travel in the source distribution,
MANIFEST.in) and each link to a heading as its text. Everything else about the build is
declared in pyproject.toml.
"""

import pathlib
import re
import tomllib

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
    "package-dir"
]
#: a Markdown link or image whose target has no scheme: a path into the tree or a heading
RELATIVE_LINK = re.compile(r"(!?)\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:)([^)\s]+)\)")


def index_readme(text: str) -> str:
    """``text`` (Markdown) with no link into the tree: ``[x](docs/a.md#b)`` becomes
    ``x (`docs/a.md`)``, or the path alone where the text is the path, and ``[x](#a)`` x."""

    def plain(m: re.Match) -> str:
        words, target = m.group(2), m.group(3)
        if target.startswith("#"):
            return words
        path = f"`{target.partition('#')[0]}`"  # a heading of another file: the file
        return path if words in (target, path, path.strip("`")) else f"{words} ({path})"

    return RELATIVE_LINK.sub(plain, text)


if __name__ == "__main__":  # as the build runs it; a test imports index_readme
    setup(
        packages=[
            found
            for name, folder in PACKAGE_DIRS.items()
            for found in (name, *(f"{name}.{sub}" for sub in find_packages(str(ROOT / folder))))
        ],
        long_description=index_readme((ROOT / "README.md").read_text("utf-8")),
        long_description_content_type="text/markdown",
    )
