"""Communication algorithms, each a :class:`commrt.Schedule` generator.

The names and :func:`resolve` live in :mod:`commrt.algorithms.registry`.

``algorithm=`` arguments across commrt take either an instance (which
carries the algorithm's options) or one of the names in :data:`NAMES`.

Example::

    >>> from commrt.algorithms import Ring, resolve
    >>> resolve("ring") == Ring()
    True
"""

from __future__ import annotations

from commrt.algorithms.auto import Auto
from commrt.algorithms.backup import BackupWorkers
from commrt.algorithms.base import Algorithm
from commrt.algorithms.broadcast import BinomialTree, PipelinedChain
from commrt.algorithms.gossip import Gossip
from commrt.algorithms.halving_doubling import HalvingDoubling
from commrt.algorithms.pipelined_torus import PipelinedTorus2D
from commrt.algorithms.recursive_doubling import RecursiveDoubling
from commrt.algorithms.registry import DEFAULT_ALGORITHM, NAMES, resolve
from commrt.algorithms.ring import Ring
from commrt.algorithms.torus import Torus2D

__all__ = [
    "Algorithm",
    "Ring",
    "HalvingDoubling",
    "RecursiveDoubling",
    "Torus2D",
    "PipelinedTorus2D",
    "Auto",
    "BinomialTree",
    "PipelinedChain",
    "BackupWorkers",
    "Gossip",
    "resolve",
    "NAMES",
    "DEFAULT_ALGORITHM",
]
