"""A communicator as an algorithm's choice sees it: :class:`HookComm`.

The algorithms (:mod:`commrt.algorithms`) are schedules and never import the
communicator, the probe or the collectives. Some of their hooks still need
what only those can give: the torus its grid from the node layout every rank
agreed on, ``auto`` a probed network, a small gather to agree on its timings,
and a device to wait for. The layers that call the hooks (the collectives,
GradientSync, the torch.distributed backend) wrap their communicator in a
:class:`HookComm` and pass it as the hooks' ``comm`` (see
:class:`commrt.algorithms.Algorithm`); each service runs here, above the
algorithms, when a hook asks for it.

Example::

    >>> from commrt.tuning.hook_comm import HookComm
    >>> Torus2D().select(8, 1 << 20, HookComm(comm))   # a row per node  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from commrt.runtime import rows
from commrt.runtime.communicator import Communicator
from commrt.tuning.memory import CLASSES, FIELDS, AutoMemory, memory_path
from commrt.tuning.probe import probe
from commrt.tuning.topology import ranks_per_node

__all__ = ["HookComm"]


class HookComm:
    """``comm`` as the algorithms' hooks receive it.

    ``rank``, ``world_size``, ``device`` and ``slots`` are the communicator's
    own (``slots`` is where ``auto`` keeps its choices). The rest are
    collective where they communicate: every rank asks in the same order, as
    the hooks are called.
    """

    __slots__ = ("comm", "rank", "world_size", "device", "slots")

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.rank, self.world_size = comm.rank, comm.world_size
        self.device, self.slots = comm.device, comm.slots

    @property
    def local_size(self) -> int | None:
        """Ranks per node as every rank agreed (:func:`~commrt.tuning.topology.ranks_per_node`:
        collective on the first ask, then cached), None where the nodes are unknown or
        uneven. The communicator's own ``local_size`` is only what this rank's launcher said."""
        return ranks_per_node(self.comm)

    @property
    def fuses_one_shot(self) -> bool:
        """Whether the transport runs a one-shot all-reduce whole (``auto`` then weighs
        the one-shot: :func:`commrt.algorithms.auto.candidates`)."""
        return self.comm.transport.traits.fuses_one_shot

    def network(self, calibration: str | None = None):
        """The :class:`commrt.sim.Network` this job's links measure as
        (:func:`~commrt.tuning.probe.probe`: collective on first use, then cached), or the
        one the ``calibration`` file holds."""
        return probe(self.comm, calibration=calibration).network()

    def memory(self, labels: tuple[str, ...]):
        """The verdicts of ``auto`` in earlier jobs of this job's shape
        (:class:`~commrt.tuning.memory.AutoMemory`), as rank 0 read them: collective on
        the first ask (one gather hands rank 0's to every rank), then cached. ``labels``:
        every candidate's label, in an order every rank shares."""
        slots = self.comm.slots
        if slots.auto_memory is None:
            path = memory_path()
            mem = AutoMemory(
                AutoMemory.shape_of(self.comm, self.local_size), path, writes=self.rank == 0
            )
            if self.rank == 0:
                mem.verdicts = mem.read()
            row = mem.encode(labels) if self.rank == 0 else [0.0] * (FIELDS * CLASSES)
            shared = rows.gather(self.comm, row)[0]
            mem.verdicts = AutoMemory.decode(shared, labels)
            slots.auto_memory = mem
        return slots.auto_memory

    def gather_rows(self, row) -> list[list]:
        """Every rank's ``row`` on every rank, in rank order (collective:
        :func:`commrt.runtime.rows.gather`)."""
        return rows.gather(self.comm, row)

    def synchronize(self) -> None:
        """Wait for the work queued on this rank's GPU (nothing to wait for on a CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __repr__(self) -> str:
        return f"HookComm({self.comm!r})"
