"""Communication algorithms, each a :class:`commrt.Schedule` generator.

``algorithm=`` arguments across commrt take either an instance (which
carries the algorithm's options) or one of the names in :data:`NAMES`.

Example::

    >>> from commrt.algorithms import Ring, resolve
    >>> resolve("ring") == Ring()
    True
"""
from __future__ import annotations

import functools

from commrt.algorithms.base import Algorithm
from commrt.algorithms.halving_doubling import HalvingDoubling
from commrt.algorithms.recursive_doubling import RecursiveDoubling
from commrt.algorithms.ring import Ring
from commrt.algorithms.torus import Torus2D
from commrt.algorithms.auto import Auto
from commrt.algorithms.broadcast import BinomialTree, PipelinedChain
from commrt.algorithms.backup import BackupWorkers
from commrt.algorithms.gossip import Gossip

__all__ = ["Algorithm", "Ring", "HalvingDoubling", "RecursiveDoubling", "Torus2D", "Auto",
           "BinomialTree", "PipelinedChain", "BackupWorkers", "Gossip",
           "resolve", "NAMES", "DEFAULT_ALGORITHM"]

_BY_NAME = {
    "ring": Ring,
    "halving_doubling": HalvingDoubling,
    "hd": HalvingDoubling,
    "recursive_doubling": RecursiveDoubling,
    "rd": RecursiveDoubling,
    "torus2d": Torus2D,
    "auto": Auto,
    "backup": BackupWorkers,   # b = 1
    "gossip": Gossip,
}
#: names accepted by ``algorithm="..."``
NAMES = tuple(sorted(_BY_NAME))
#: what ``algorithm=`` defaults to in :class:`commrt.GradientSync` and :func:`commrt.all_reduce`
DEFAULT_ALGORITHM = "ring"


def resolve(algorithm: "str | Algorithm") -> Algorithm:
    """Turn an ``algorithm=`` argument into an :class:`Algorithm` instance.

    A name gives the same (frozen, default-option) instance every time, so
    the schedules it caches are found again by every call.
    """
    if isinstance(algorithm, Algorithm):
        return algorithm
    if isinstance(algorithm, str):
        return _named(algorithm)
    raise TypeError(f"algorithm must be a name or an Algorithm instance, got {type(algorithm).__name__}")


@functools.lru_cache(maxsize=64)
def _named(name: str) -> Algorithm:
    cls = _BY_NAME.get(name.lower().replace("-", "_"))
    if cls is None:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(NAMES)} "
                         f"or pass an instance such as commrt.algorithms.Ring()")
    return cls()
