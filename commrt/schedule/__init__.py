"""Collectives as data, and how they run.

The intermediate representation (:mod:`commrt.schedule.steps`: ``Op``,
``Step``, ``Steps``; :mod:`commrt.schedule.ir`: ``Schedule``), its
symbolic checker (:mod:`commrt.schedule.check`), a schedule compiled for one
rank and one buffer, its messages cut into pieces (:mod:`commrt.schedule.plan`),
the executor that runs a schedule for one rank on a transport
(:mod:`commrt.schedule.executor`), the plan bound to one buffer that it caches
and runs (:mod:`commrt.schedule.bound`), its caches of plans, bindings and
scratch (:mod:`commrt.schedule.caches`), and its record of where this rank is, kept for
stalls (:mod:`commrt.schedule.position`),
the point-to-point exchange for traffic outside schedules
(:mod:`commrt.schedule.p2p`) and the one tag registry
(:mod:`commrt.schedule.tags`).

The IR's names are importable from here::

    from commrt.schedule import Schedule, Step, Op, Collective
"""

from commrt.schedule.ir import (
    RECV_COPY,
    RECV_REDUCE,
    SEND,
    CheckReport,
    Collective,
    Op,
    OpKind,
    Schedule,
    Step,
    Steps,
    check,
    chunk_bounds,
    parallel,
    sequence,
)

__all__ = [
    "Collective",
    "OpKind",
    "Op",
    "Step",
    "Steps",
    "Schedule",
    "CheckReport",
    "check",
    "chunk_bounds",
    "parallel",
    "sequence",
    "SEND",
    "RECV_REDUCE",
    "RECV_COPY",
]
