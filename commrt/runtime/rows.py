"""Every rank's small row of numbers, on every rank: how ranks agree on anything.

The primitive under the control store's address, the node layout, the
probe's agreed timings and consensus reports. It sits in the runtime, below
the tuning and the collectives, so that what they depend on (the node
layout that ``Torus2D()`` reads, the store that backup workers meet in) can
use it without a cycle.
"""

from __future__ import annotations

import torch

from commrt.algorithms.recursive_doubling import RecursiveDoubling
from commrt.runtime.communicator import Communicator

#: the gather's all-reduce: a table is small, so the fewest steps win (log2 p, where a ring
#: takes 2(p - 1): at p = 4 over shm, 115 µs a gather of 7 numbers against the ring's 303)
_SCHEDULE = RecursiveDoubling()
#: row tables a communicator keeps (one per row length and dtype; ``auto``'s phases use a
#: few lengths), the least recently made dropped first
TABLES_KEPT = 8


def gather(comm: Communicator, row, dtype: torch.dtype = torch.float64, agree=None) -> list[list]:
    """Every rank's ``row`` (same length everywhere), on every rank, in rank order.

    One sum all-reduce of a p-row table in which each rank fills only its
    own row: exact in any order of the sums (each slot adds one value to
    zeros), so identical on every rank, and it cannot deadlock on a mismatch
    the way differently sized messages could. Collective, and admitted as
    every collective is (:meth:`~commrt.Communicator.admit_collective`, then
    :meth:`~commrt.Communicator.run_held` under its lock); ``agree(length)``,
    if given, runs between the two (:func:`commrt.collectives.core.gather_rows`
    checks there that every rank's row has this length).

    The table is kept per communicator, length and dtype (``comm.slots.row_tables``),
    so that its binding to the schedule is made once: made afresh each call, a gather
    of 5 numbers took 370 µs over shm at p = 2, where an 8 B ring all-reduce took 38,
    and ``auto`` gathers once per phase of its learning.
    """
    comm.admit_collective()
    row = list(row)
    if agree is not None:
        agree(len(row))
    with comm.lock:  # the kept table is this communicator's: one gather at a time
        table = _table(comm, len(row), dtype)
        _fill(table, comm.rank, row)
        if comm.world_size > 1:
            comm.run_held(_SCHEDULE.schedule(comm.world_size), table, owner=table)
        return table.cpu().tolist()


def _fill(table: torch.Tensor, rank: int, row: list) -> None:
    """Zero ``table`` and write ``row`` as ``rank``'s. On the CPU through a NumPy view:
    ``auto`` gathers after a stretch of settled calls, where these were a phase's first
    torch calls and took 45-67 µs over shm at p = 2, the NumPy view's 12."""
    if table.device.type == "cpu" and table.dtype != torch.bfloat16:  # NumPy has no bf16
        view = table.numpy()
        view.fill(0)
        view[rank] = row
    else:
        table.zero_()
        table[rank] = torch.tensor(row, dtype=table.dtype)


def _table(comm: Communicator, length: int, dtype: torch.dtype) -> torch.Tensor:
    """This communicator's kept table for rows of ``length`` ``dtype`` values."""
    kept = comm.slots.row_tables
    table = kept.get((length, dtype))
    if table is None:
        if len(kept) >= TABLES_KEPT:
            del kept[next(iter(kept))]
        table = torch.zeros(comm.world_size, length, dtype=dtype, device=comm.device)
        kept[(length, dtype)] = table
    return table
