"""Backup workers' control plane under one store: cost per global step, p = 4 … 4096.

Every global step of backup workers goes through one key-value store
(:mod:`commrt.store`, torch's ``TCPStore``: one server thread answers every
client in turn). The model prices what the protocol of
:mod:`commrt.sync.backup` asks of it, from three measured numbers
(:class:`StoreCost`, ``bench/bench_control_plane.py``):

* ``rtt_s``: one client's round trip for a one-key operation;
* ``op_s``: the server's time per one-key operation (from its throughput
  with many clients);
* ``key_s``: the server's extra time per further key of a multi-key read.

**Flat** (the protocol as built): per step each of the p ranks checks it
was not declared dead, takes a ticket (``add``), writes its name, polls
for the first N names (``polls`` checks of N keys), reads them, and looks
once for catch-up requests: ``5 + polls`` operations, ``(polls + 1)·N``
further keys. The server's work per step is the sum over ranks,
W = p·((5 + polls)·op + (polls + 1)·N·key): O(p²) because every rank
reads every name.

**Two-level** (a per-node leader, the simulator's proposal): a rank hands
its arrival to its node's leader (a node-local hop, ``local_rtt_s``), the
leader takes the node's tickets with one ``add`` of k and writes one record
for them; the leader whose record crosses ticket N reads the records up to
N once and writes the participants as ONE key (a bitmap of p bits); the
other leaders poll and read that key and hand it to their ranks (a second
local hop). With m = ⌈p / ranks_per_node⌉ leaders and late ranks forming
at most b extra records: W = (m + b)·(4 + polls)·op + m·key. O(p / r).

**Heartbeats** (:mod:`commrt.sync.backup.liveness`): 3 operations per rank
per period (beat, death counter, one neighbour): 3p / period per second;
before, each rank read all p counters: p·(p + 1) / period; in the
two-level form the leaders beat and watch for their nodes (liveness inside
a node stays on the node): 3m / period. They take a fraction
f = ops/s · op of the server's time; f ≥ 1 saturates it.

**Latency.** All ranks arrive at about the same time, so the server's queue
holds a step's work at once: a rank's control plane takes the longer of its
own round trips and the server's work slowed by the heartbeats' share,
max(k·rtt, W / (1 − f)), plus the local hops in the two-level form; ∞ when
f ≥ 1. The store's *busy share* at one step every ``step_s`` is
W / step_s + f: at 1 or more it cannot keep up with the steps
(:func:`first_saturated`). Not modelled: the network between the clients and the server (its
bandwidth for the names and bitmap), several stores (sharding keys), the
catch-up traffic of late ranks (request, claim, response: a few operations
per late rank), the commit of each step on gloo (about three one-key
operations per rank and its polls of one key: O(p),
:mod:`commrt.sync.backup.recovery`).

Example::

    >>> from commrt.sim.control import StoreCost, control_cost
    >>> c = control_cost(16, 1, StoreCost(70e-6, 70e-6, 5e-6))
    >>> round(c.flat_s * 1e3, 1), c.flat_ops
    (11.6, 112.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commrt.sim.network import check_number

__all__ = ["StoreCost", "ControlCost", "control_cost", "first_saturated"]

#: heartbeat period of :mod:`commrt.sync.backup.liveness` (``HEARTBEAT_S``; the simulator
#: does not import the runtime's policy modules)
HEARTBEAT_S = 0.25


@dataclass(frozen=True)
class StoreCost:
    """What one store operation costs (seconds); see the module docstring."""

    rtt_s: float
    op_s: float
    key_s: float
    source: str = "given"

    def __post_init__(self):
        for name in ("rtt_s", "op_s", "key_s"):
            check_number(f"StoreCost.{name}", getattr(self, name), positive=name != "key_s")

    @classmethod
    def measured(cls) -> "StoreCost":
        """``python bench/bench_control_plane.py`` on the 2-core development machine, shared
        (load average 8 to 12), torch's TCPStore over loopback, medians of 5 runs with 16
        client threads. Runs on that machine ranged 25 to 91 us (rtt), 27 to 72 us (op)
        and 0 to 5 us (key): give ``--store-cost`` for another machine."""
        return cls(75.5e-6, 45.8e-6, 3.37e-6, "bench_control_plane.py, 2-core dev machine")

    @classmethod
    def parse(cls, text: str) -> "StoreCost":
        """``RTT_US,OP_US,KEY_US`` (microseconds), as the bench prints them."""
        try:
            rtt, op, key = (float(x) * 1e-6 for x in text.split(","))
        except ValueError:
            raise ValueError(f"store cost RTT_US,OP_US,KEY_US, got {text!r}") from None
        return cls(rtt, op, key, f"given: {text}")

    def describe(self) -> str:
        return (
            f"rtt {self.rtt_s * 1e6:.0f} us, {self.op_s * 1e6:.0f} us/op, "
            f"{self.key_s * 1e6:.1f} us/key"
        )


@dataclass(frozen=True)
class ControlCost:
    """The control plane's cost per global step at one p (seconds; ``inf``: saturated)."""

    p: int
    n: int
    flat_s: float  # what a rank waits for its step's participants, flat
    two_level_s: float  # the same with a leader per node
    flat_busy: float  # the server's busy share at ``step_s`` per step, flat (1 = full)
    two_level_busy: float
    heartbeat_share: float  # heartbeats' share of the server's time (3p / period)
    heartbeat_share_before: float  # the same when every rank read every counter
    two_level_heartbeat_share: float  # leaders beat for their nodes (3m / period)
    flat_ops: float  # store operations per step (all ranks), flat
    two_level_ops: float


def control_cost(
    p: int,
    backups: int,
    cost: StoreCost,
    *,
    ranks_per_node: int = 8,
    step_s: float = 0.1,
    polls: int = 2,
    local_rtt_s: float | None = None,
    period_s: float = HEARTBEAT_S,
) -> ControlCost:
    """The control plane of one global step on ``p`` ranks with ``backups`` backups."""
    if p <= backups:
        raise ValueError(f"backup workers need p > b, got p={p}, b={backups}")
    n, m = p - backups, math.ceil(p / ranks_per_node)
    local = cost.rtt_s if local_rtt_s is None else local_rtt_s
    hb = 3 * p / period_s * cost.op_s
    hb_two = 3 * m / period_s * cost.op_s  # leaders beat and watch for their nodes
    flat_ops = p * (5 + polls)
    flat_work = flat_ops * cost.op_s + p * (polls + 1) * n * cost.key_s
    two_ops = (m + backups) * (4 + polls)
    two_work = two_ops * cost.op_s + m * cost.key_s
    rtts = (5 + polls) * cost.rtt_s

    def latency(work: float, share: float) -> float:
        return math.inf if share >= 1 else max(rtts, work / (1 - share))

    return ControlCost(
        p=p,
        n=n,
        flat_s=latency(flat_work, hb),
        two_level_s=2 * local + latency(two_work, hb_two),
        flat_busy=flat_work / step_s + hb,
        two_level_busy=two_work / step_s + hb_two,
        heartbeat_share=hb,
        heartbeat_share_before=p * (p + 1) / period_s * cost.op_s,
        two_level_heartbeat_share=hb_two,
        flat_ops=float(flat_ops),
        two_level_ops=float(two_ops),
    )


def first_saturated(costs, form: str = "flat") -> int | None:
    """The smallest p of ``costs`` where the store is busy all the time (a step every
    ``step_s`` asks more of it than it can do) in ``form`` (``flat``, ``two-level``), or
    None."""
    for c in costs:
        if (c.flat_busy if form == "flat" else c.two_level_busy) >= 1:
            return c.p
    return None
