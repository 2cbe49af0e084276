"""The algorithm registry: the names ``algorithm="..."`` accepts and :func:`resolve`.

Example::

    >>> from commrt.algorithms.registry import resolve
    >>> resolve("hd").name
    'halving_doubling'
"""

from __future__ import annotations

import functools

from commrt.algorithms.auto import Auto
from commrt.algorithms.backup import BackupWorkers
from commrt.algorithms.base import Algorithm
from commrt.algorithms.gossip import Gossip
from commrt.algorithms.halving_doubling import HalvingDoubling
from commrt.algorithms.pipelined_torus import PipelinedTorus2D
from commrt.algorithms.recursive_doubling import RecursiveDoubling
from commrt.algorithms.ring import Ring
from commrt.algorithms.torus import Torus2D
from commrt.sim.naming import use_resolver

__all__ = ["resolve", "NAMES", "DEFAULT_ALGORITHM"]

_BY_NAME = {
    "ring": Ring,
    "halving_doubling": HalvingDoubling,
    "hd": HalvingDoubling,
    "recursive_doubling": RecursiveDoubling,
    "rd": RecursiveDoubling,
    "torus2d": Torus2D,
    "torus2d_pipelined": PipelinedTorus2D,
    "auto": Auto,
    "backup": BackupWorkers,  # b = 1
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
    if isinstance(algorithm, str):  # first: the usual spelling, and no ABC check
        return _named(algorithm)
    if isinstance(algorithm, Algorithm):
        return algorithm
    raise TypeError(
        f"algorithm must be a name or an Algorithm instance, got {type(algorithm).__name__}"
    )


@functools.lru_cache(maxsize=64)
def _named(name: str) -> Algorithm:
    cls = _BY_NAME.get(name.lower().replace("-", "_"))
    if cls is None:
        raise ValueError(
            f"unknown algorithm {name!r}; choose one of {', '.join(NAMES)} "
            f"or pass an instance such as commrt.algorithms.Ring()"
        )
    return cls()


# The simulator takes names too but may not import the algorithms (they import it).
use_resolver(resolve)
