"""Where the ranks sit: how many share a node, as every rank agrees.

Kept apart from the communicator because agreeing takes a collective
(:func:`commrt.runtime.rows.gather`), and collectives build on the communicator,
never the other way round.
"""

from __future__ import annotations

from commrt.runtime import rows as _rows
from commrt.runtime.communicator import Communicator
from commrt.runtime.slots import NodeLayout


def ranks_per_node(comm: Communicator) -> int | None:
    """Ranks per node as every rank agrees: collective on the first call, then cached.

    L when each rank's launcher says L ranks share its node and they sit
    in blocks (local rank = rank mod L) with 1 < L < world size; None,
    on every rank alike, otherwise (one node, one rank per node, uneven
    nodes, no launcher information). ``Torus2D()``'s default grid and
    the probe's two link classes follow it, so a launch whose ranks
    disagree about their nodes gets the same schedule everywhere, not a
    hang.

    Example::

        >>> from commrt.tuning.topology import ranks_per_node
        >>> ranks_per_node(comm)   # torchrun --nnodes 4 --nproc-per-node 8  # doctest: +SKIP
        8
    """
    if comm.slots.node_layout is None:
        p, agreed = comm.world_size, None
        if p > 1:
            rows = _rows.gather(comm, [comm.local_size or 0, comm.local_rank])
            L = int(rows[0][0])
            blocks = all((int(a), int(b)) == (L, r % max(L, 1)) for r, (a, b) in enumerate(rows))
            agreed = L if 1 < L < p and p % L == 0 and blocks else None
        comm.slots.node_layout = NodeLayout(agreed)
    return comm.slots.node_layout.ranks_per_node
