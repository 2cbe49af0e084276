"""What other modules derive once per communicator: :class:`CommSlots`."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CommSlots", "NodeLayout"]


@dataclass(frozen=True)
class NodeLayout:
    """Ranks per node as every rank agreed (see :func:`commrt.tuning.topology.ranks_per_node`)."""

    ranks_per_node: int | None


@dataclass
class CommSlots:
    """What other modules derive once per communicator, one typed field each (not a
    string-keyed dict: a reader finds every user of a slot by its name). The caches among
    them are listed with every other, in one place: :mod:`commrt.collectives`."""

    #: commrt.tuning.topology: ranks per node as every rank agreed (collective on first use)
    node_layout: NodeLayout | None = None
    #: commrt.tuning.probe: the measured network model (a ProbeResult)
    probe: object | None = None
    #: commrt.algorithms.auto: (Auto, world size, bytes) -> Choice, identical on every rank
    auto_choices: dict = field(default_factory=dict)
    #: commrt.algorithms.auto_learn: (Auto, world size, bytes) -> Tuning, identical on every rank
    auto_tuning: dict = field(default_factory=dict)
    #: commrt.algorithms.auto: (Auto, world size, bytes, label) -> a tried candidate's Choice
    auto_tried: dict = field(default_factory=dict)
    #: commrt.tuning.memory: earlier jobs' verdicts, as rank 0 read them (an AutoMemory)
    auto_memory: object | None = None
    #: commrt.algorithms.auto: (Auto, world size, bytes) -> the model's choice, for a size
    #: whose learning started from an earlier job's verdict (commrt.tuning.memory)
    auto_remembered: dict = field(default_factory=dict)
    #: commrt.runtime.store: the job's control store (a ControlStore)
    control_store: object | None = None
    #: commrt.sync.backup: backup-worker policies made so far (each gets its own key space)
    backup_instances: int = 0
    #: commrt.collectives.core: call signatures all ranks agreed on (each checked on first use)
    agreed_calls: set = field(default_factory=set)
    #: commrt.runtime.rows: (row length, dtype) -> the table gather() reduces rows in, kept
    #: so that its binding is made once (at most rows.TABLES_KEPT)
    row_tables: dict = field(default_factory=dict)
    #: commrt.collectives.reductions: the dtypes each op reduces (None: commrt's own; gloo's
    #: on a torch.distributed group's communicator)
    dtype_rules: object | None = None
