"""Every rank's small row of numbers, on every rank: how ranks agree on anything.

The primitive under the control store's address, the node layout, the
probe's agreed timings and consensus reports. It sits in the runtime, below
the tuning and the collectives, so that what they depend on (the node
layout that ``Torus2D()`` reads, the store that backup workers meet in) can
use it without a cycle.
"""

from __future__ import annotations

import torch

from commrt.algorithms.ring import Ring
from commrt.runtime.communicator import Communicator

_RING = Ring()


def gather(comm: Communicator, row, dtype: torch.dtype = torch.float64, agree=None) -> list[list]:
    """Every rank's ``row`` (same length everywhere), on every rank, in rank order.

    One sum all-reduce of a p-row table in which each rank fills only its
    own row: exact (each slot adds one value to zeros), identical on every
    rank, and it cannot deadlock on a mismatch the way differently sized
    messages could. Collective, and admitted as every collective is
    (:meth:`~commrt.Communicator.admit_collective`, then
    :meth:`~commrt.Communicator.run_schedule`); ``agree(length)``, if given,
    runs between the two (:func:`commrt.collectives.core.gather_rows` checks
    there that every rank's row has this length).
    """
    comm.admit_collective()
    row = list(row)
    if agree is not None:
        agree(len(row))
    table = torch.zeros(comm.world_size, len(row), dtype=dtype, device=comm.device)
    table[comm.rank] = torch.tensor(row, dtype=dtype)
    if comm.world_size > 1:
        comm.run_schedule(_RING.schedule(comm.world_size), table, owner=table)
    return table.cpu().tolist()
