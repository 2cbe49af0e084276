"""The algorithm names, and the algorithms they stand for, below backup workers.

:class:`~commrt.algorithms.BackupWorkers` names its ``inner`` all-reduce with these
names, so its own name cannot be resolved here (its module would import itself
back): :mod:`commrt.algorithms.registry` adds ``"backup"``, and its
:func:`~commrt.algorithms.registry.resolve` is what the rest of commrt calls.

Example::

    >>> from commrt.algorithms.names import named
    >>> named("hd").name
    'halving_doubling'
"""

from __future__ import annotations

import functools

from commrt.algorithms.auto import Auto
from commrt.algorithms.base import Algorithm
from commrt.algorithms.gossip import Gossip
from commrt.algorithms.halving_doubling import HalvingDoubling
from commrt.algorithms.one_shot import OneShot, TwoShot
from commrt.algorithms.pipelined_torus import PipelinedTorus2D
from commrt.algorithms.recursive_doubling import RecursiveDoubling
from commrt.algorithms.ring import Ring
from commrt.algorithms.torus import Torus2D
from commrt.errors import did_you_mean

__all__ = ["BACKUP", "NAMES", "key", "named"]

_BY_NAME = {
    "ring": Ring,
    "halving_doubling": HalvingDoubling,
    "hd": HalvingDoubling,
    "recursive_doubling": RecursiveDoubling,
    "rd": RecursiveDoubling,
    "torus2d": Torus2D,
    "torus2d_pipelined": PipelinedTorus2D,
    "auto": Auto,
    "gossip": Gossip,
    "one_shot": OneShot,
    "two_shot": TwoShot,
}
#: the name of :class:`~commrt.algorithms.BackupWorkers` (b = 1), which the registry adds
BACKUP = "backup"
#: names accepted by ``algorithm="..."``
NAMES = tuple(sorted([*_BY_NAME, BACKUP]))


def key(name: str) -> str:
    """``name`` as the table spells it: lower case, ``_`` for ``-``."""
    return name.lower().replace("-", "_")


@functools.lru_cache(maxsize=64)
def named(name: str) -> Algorithm:
    """The (frozen, default-option) algorithm ``name`` stands for, the same instance every
    time; ValueError for an unknown name, or for ``"backup"`` (see the module doc)."""
    cls = _BY_NAME.get(key(name))
    if cls is None:
        raise ValueError(
            f"unknown algorithm {name!r}; choose one of {', '.join(NAMES)} "
            f"or pass an instance such as commrt.algorithms.Ring(){did_you_mean(name, NAMES)}"
        )
    return cls()
