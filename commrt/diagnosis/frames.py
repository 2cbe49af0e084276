"""Which frames of a stack are the user's, and how a file is named in a verdict: the
stall watch (:mod:`commrt.diagnosis.stall`) shows a stuck rank's innermost *user* frames
(outside commrt, torch and the standard library), whose files it names relative to the
working folder."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(packages, standard library, site folders): the folders of commrt (with its
    algorithms and kernels) and torch; the standard library's; and the folders packages
    install into, which lie inside the standard library's but hold the user's code too
    (a training script in an installed package, run through ``runpy``)."""
    import site

    import torch

    import commrt.algorithms
    import commrt.kernels

    mods = (commrt.algorithms, commrt.kernels, torch)
    packages = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    packages |= {os.path.dirname(os.path.abspath(m.__file__)) for m in mods}
    paths = sysconfig.get_paths()
    stdlib = {paths[k] for k in ("stdlib", "platstdlib")}
    sites = {paths[k] for k in ("purelib", "platlib")} | set(site.getsitepackages())
    sites |= {site.getusersitepackages()}
    sites |= {p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")}
    return tuple(tuple(os.path.realpath(d) + os.sep for d in x) for x in (packages, stdlib, sites))


def is_user(filename: str) -> bool:
    """Whether a frame in ``filename`` is the user's: outside commrt, torch and the standard
    library (whose site-packages folders hold user code too; see :func:`_library_dirs`)."""
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    packages, stdlib, sites = _library_dirs()
    if path.startswith(packages):
        return False
    return not path.startswith(stdlib) or path.startswith(sites)


def short(filename: str) -> str:
    """``filename`` relative to the working folder where it lies under it."""
    rel = os.path.relpath(filename) if os.path.isabs(filename) else filename
    return filename if rel.startswith("..") else rel
