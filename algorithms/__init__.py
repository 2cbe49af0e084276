"""Communication algorithms, each a :class:`commrt.Schedule` generator.

The names and :func:`resolve` live in :mod:`commrt.algorithms.registry`.

One module per job:

* :mod:`~commrt.algorithms.base`: the :class:`Algorithm` interface every algorithm
  implements;
* :mod:`~commrt.algorithms.names`: the names below backup workers and what each
  stands for; :mod:`~commrt.algorithms.registry` adds ``"backup"`` and :func:`resolve`;
* :mod:`~commrt.algorithms.fragments`: the pieces bigger schedules are composed of
  (ring reduce-scatter and all-gather, the power-of-two fold);
* all-reduce: :mod:`~commrt.algorithms.ring`, :mod:`~commrt.algorithms.halving_doubling`
  (Rabenseifner), :mod:`~commrt.algorithms.recursive_doubling` (the fewest steps, for
  small buffers), :mod:`~commrt.algorithms.one_shot` (one-shot and two-shot: every
  rank with every other, directly), :mod:`~commrt.algorithms.torus` (the 2D torus) and
  :mod:`~commrt.algorithms.pipelined_torus` (the torus in pipelined segments);
* :mod:`~commrt.algorithms.broadcast`: a binomial tree and a pipelined chain;
* :mod:`~commrt.algorithms.auto`: ``"auto"``, which picks an algorithm per buffer size
  from the cost model, :mod:`~commrt.algorithms.auto_learn`, how it learns from
  what it runs, :mod:`~commrt.algorithms.auto_trial`, how its trials are laid out
  and paced, :mod:`~commrt.algorithms.auto_cost`, what its learning costs as the job
  measures it, :mod:`~commrt.algorithms.auto_times`, how it reads its timings, and
  :mod:`~commrt.algorithms.auto_recall`, how it starts from earlier jobs' verdicts;
* beyond all-reduce: :mod:`~commrt.algorithms.backup` (backup workers) and
  :mod:`~commrt.algorithms.gossip` (GossipGraD, one partner per step).

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
from commrt.algorithms.one_shot import OneShot, TwoShot
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
    "OneShot",
    "TwoShot",
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
