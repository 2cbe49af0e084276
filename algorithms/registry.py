"""The algorithm registry: the names ``algorithm="..."`` accepts and :func:`resolve`.

The table of names is :mod:`commrt.algorithms.names`, which
:class:`~commrt.algorithms.BackupWorkers` reads for its inner algorithm; this
module adds backup workers' own name. The simulator resolves names here too.

Example::

    >>> from commrt.algorithms.registry import resolve
    >>> resolve("hd").name
    'halving_doubling'
"""

from __future__ import annotations

import functools

from commrt.algorithms.backup import BackupWorkers
from commrt.algorithms.base import Algorithm
from commrt.algorithms.names import BACKUP, NAMES, key, named

__all__ = ["resolve", "NAMES", "DEFAULT_ALGORITHM"]

#: what ``algorithm=`` defaults to in :class:`commrt.GradientSync` and :func:`commrt.all_reduce`
DEFAULT_ALGORITHM = "ring"


def resolve(algorithm: "str | Algorithm") -> Algorithm:
    """Turn an ``algorithm=`` argument into an :class:`Algorithm` instance.

    A name gives the same (frozen, default-option) instance every time, so
    the schedules it caches are found again by every call.
    """
    if isinstance(algorithm, str):  # first: the usual spelling, and no ABC check
        return _named(algorithm)
    if isinstance(algorithm, Algorithm):
        return algorithm
    raise TypeError(
        f"algorithm must be a name or an Algorithm instance, got {type(algorithm).__name__}"
    )


@functools.lru_cache(maxsize=64)
def _named(name: str) -> Algorithm:
    if key(name) == BACKUP:
        return BackupWorkers()  # b = 1
    return named(name)
