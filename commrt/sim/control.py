"""Backup workers' control plane under one store: cost per global step, p = 4 … 4096.

Every global step of backup workers goes through one key-value store
(:mod:`commrt.runtime.store`, torch's ``TCPStore``: one server thread answers every
client in turn). The model prices what the protocol of
:mod:`commrt.sync.backup` asks of it on gloo (the fault-tolerant path, where
each step also commits), from three measured numbers (:class:`StoreCost`,
``bench/bench_control_plane.py``):

* ``rtt_s``: one client's round trip for a one-key operation;
* ``op_s``: the server's time per one-key operation (from its throughput
  with many clients);
* ``key_s``: the server's extra time per further key of a multi-key read.

A step asks the store in two bursts, separated by the participants'
reduction: *arrival* when the ranks' first buckets are ready, *commit* when
their reductions end. Every wait is ``polls`` checks
(:func:`commrt.process.polling.poll`); a wait's first miss also looks once for
catch-up requests (its idle work), counted once per wait.

**Flat** (the protocol as built). *Arrival*: each of the p ranks checks it
was not declared dead, takes a ticket (``add``), writes its name, polls
for the first N names (``polls`` checks of N keys), reads them, and looks
once for catch-up requests: ``5 + polls`` operations, ``(polls + 1)·N``
further keys. *Commit* (:mod:`commrt.sync.backup.recovery`, all one-key
operations): each of the N participants checks that the setup group is
not broken (once its round 0 begins, until a failure breaks it; it runs
just after arrival, counted here), counts itself on ``ok/{g}/0``
(``add``), polls the outcome ``o/{g}/0`` (``polls`` checks, one look for
requests), checks and reads it, and after its update looks for requests
once more (``BackupPolicy.apply``): ``6 + polls``; each of the b late
ranks polls, looks, checks and reads: ``3 + polls``; the participant whose
count reaches N proposes ``commit`` (one ``compare_set``). The server's
work per step is the sum over ranks, W = W_a + W_c with
W_a = p·((5 + polls)·op + (polls + 1)·N·key): O(p²) because every rank
reads every name, and W_c = (N·(6 + polls) + b·(3 + polls) + 1)·op: O(p).

**Two-level** (a per-node leader, the simulator's proposal). *Arrival*: a
rank hands its arrival to its node's leader (a node-local hop,
``local_rtt_s``), the leader takes the node's tickets with one ``add`` of k
and writes one record for them; the leader whose record crosses ticket N
reads the records up to N once and writes the participants as ONE key (a
bitmap of p bits); the other leaders poll and read that key and hand it to
their ranks (a second local hop). *Commit*: a participant tells its
leader its reduction ended (a local hop); once its node's k participants
have, the leader counts them with one ``add`` of k (a failure proposes
``redo`` instead, as a participant does), the one reaching N proposes
``commit``, and every leader polls, reads and hands the outcome to its
node's ranks, late ones included (a local hop). The leader does the
setup-group check and the looks for requests for its node: ``6 + polls``
per leader, as a flat participant. With m = ⌈p / ranks_per_node⌉ leaders
and late ranks forming at most b extra arrival records:
W = (m + b)·(4 + polls)·op + m·key + (m·(6 + polls) + 1)·op. O(p / r).

**Heartbeats** (:mod:`commrt.sync.backup.liveness`): 3 operations per rank
per period (beat, death counter, one neighbour): 3p / period per second;
before, each rank read all p counters: p·(p + 1) / period; in the
two-level form the leaders beat and watch for their nodes (liveness inside
a node stays on the node): 3m / period. They take a fraction
f = ops/s · op of the server's time; f ≥ 1 saturates it.

**Latency.** All ranks arrive at about the same time, and finish their
reductions at about the same time, so the server's queue holds a burst's
work at once: a rank's wait in each burst is the longer of its own round
trips (``5 + polls`` for arrival, ``6 + polls`` for the commit) and the
burst's work slowed by the heartbeats' share, max(k·rtt, W_x / (1 − f)),
plus two local hops per burst in the two-level form; the step's control
plane is the sum of the two bursts, ∞ when f ≥ 1. The store's *busy
share* at one step every ``step_s`` is W / step_s + f: at 1 or more it
cannot keep up with the steps (:func:`first_saturated`). Not modelled:
the network between the clients and the server (its bandwidth for the
names and bitmap), several stores (sharding keys), the catch-up traffic
of late ranks (request, claim, response: a few operations per late
rank), and redo rounds (a failed round repeats arrival and commit among
the live ranks, and makes a group).

Example::

    >>> from commrt.sim.control import StoreCost, control_cost
    >>> c = control_cost(16, 1, StoreCost(70e-6, 70e-6, 5e-6))
    >>> round(c.flat_s * 1e3, 1), c.flat_ops
    (20.5, 238.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commrt import settings
from commrt.sim.links import check_number

__all__ = ["StoreCost", "ControlCost", "control_cost", "first_saturated"]

HEARTBEAT_S = settings.Seconds(
    0.25,
    "backup workers' heartbeat period (`commrt.sync.backup.liveness.HEARTBEAT_S`), as the control "
    "plane's model prices it",
    "`commrt simulate`",
    settings.POLLING,
)


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
        """The default costs: medians from ``python bench/bench_control_plane.py`` (torch's
        TCPStore over loopback, 16 client threads; the run is in docs/benchmarks.md). A
        store's costs vary with the machine and its load: give ``--store-cost`` with the
        bench's numbers for yours."""
        return cls(75.5e-6, 45.8e-6, 3.37e-6, "loopback defaults; --store-cost sets yours")

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
            f"rtt {self.rtt_s * 1e6:.0f} µs, {self.op_s * 1e6:.0f} µs/op, "
            f"{self.key_s * 1e6:.1f} µs/key"
        )


@dataclass(frozen=True)
class ControlCost:
    """The control plane's cost per global step at one p (seconds; ``inf``: saturated);
    arrival and commit together (the ``*_commit_*`` fields: the commit's part)."""

    p: int
    n: int
    flat_s: float  # what a rank waits in the store per step (arrival + commit), flat
    two_level_s: float  # the same with a leader per node
    flat_busy: float  # the server's busy share at ``step_s`` per step, flat (1 = full)
    two_level_busy: float
    heartbeat_share: float  # heartbeats' share of the server's time (3p / period)
    heartbeat_share_before: float  # the same when every rank read every counter
    two_level_heartbeat_share: float  # leaders beat and watch for their nodes (3m / period)
    flat_ops: float  # store operations per step (all ranks), flat
    two_level_ops: float
    flat_commit_s: float  # the commit's part of ``flat_s``
    two_level_commit_s: float
    flat_commit_ops: float  # the commit's part of ``flat_ops``
    two_level_commit_ops: float


@dataclass(frozen=True)
class _Burst:
    """One burst of store work per step: operations, the server's seconds, a rank's round
    trips (the module docstring's W_x and k)."""

    ops: int
    work_s: float
    rtts: int

    def wait(self, cost: StoreCost, share: float, hops_s: float = 0.0) -> float:
        """A rank's wait in this burst while the heartbeats take ``share`` of the server."""
        if share >= 1:
            return math.inf
        return hops_s + max(self.rtts * cost.rtt_s, self.work_s / (1 - share))


def _bursts(p: int, n: int, m: int, b: int, polls: int, cost: StoreCost) -> tuple:
    """(flat arrival, flat commit, two-level arrival, two-level commit): the module
    docstring's counts, operation by operation."""
    op, key = cost.op_s, cost.key_s
    # dead check, ticket, name, polls, read, one look for requests; N keys per poll and read
    arrive = _Burst(p * (5 + polls), p * (5 + polls) * op + p * (polls + 1) * n * key, 5 + polls)
    # participant: setup-group check, ok count, polls, look, check + get, look after the update;
    # late rank: polls, look, check + get; one compare_set
    flat_commit = n * (6 + polls) + b * (3 + polls) + 1
    commit = _Burst(flat_commit, flat_commit * op, 6 + polls)
    two_arrive = _Burst((m + b) * (4 + polls), (m + b) * (4 + polls) * op + m * key, 5 + polls)
    two_commit = m * (6 + polls) + 1  # a leader does a flat participant's part for its node
    return arrive, commit, two_arrive, _Burst(two_commit, two_commit * op, 6 + polls)


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
    """The control plane of one global step (arrival and commit) on ``p`` ranks with
    ``backups`` backups."""
    if p <= backups:
        raise ValueError(f"backup workers need p > b, got p={p}, b={backups}")
    if isinstance(polls, bool) or not isinstance(polls, int) or polls < 1:
        raise ValueError(f"polls is the checks per wait, at least 1, got {polls!r}")
    n, m = p - backups, math.ceil(p / ranks_per_node)
    hops = 2 * (cost.rtt_s if local_rtt_s is None else local_rtt_s)  # to the leader and back
    hb = 3 * p / period_s * cost.op_s
    hb_two = 3 * m / period_s * cost.op_s  # leaders beat and watch for their nodes
    arrive, commit, two_arrive, two_commit = _bursts(p, n, m, backups, polls, cost)
    flat_commit_s, two_commit_s = commit.wait(cost, hb), two_commit.wait(cost, hb_two, hops)
    return ControlCost(
        p=p,
        n=n,
        flat_s=arrive.wait(cost, hb) + flat_commit_s,
        two_level_s=two_arrive.wait(cost, hb_two, hops) + two_commit_s,
        flat_busy=(arrive.work_s + commit.work_s) / step_s + hb,
        two_level_busy=(two_arrive.work_s + two_commit.work_s) / step_s + hb_two,
        heartbeat_share=hb,
        heartbeat_share_before=p * (p + 1) / period_s * cost.op_s,
        two_level_heartbeat_share=hb_two,
        flat_ops=float(arrive.ops + commit.ops),
        two_level_ops=float(two_arrive.ops + two_commit.ops),
        flat_commit_s=flat_commit_s,
        two_level_commit_s=two_commit_s,
        flat_commit_ops=float(commit.ops),
        two_level_commit_ops=float(two_commit.ops),
    )


def first_saturated(costs, form: str = "flat") -> int | None:
    """The smallest p of ``costs`` where the store is busy all the time (a step every
    ``step_s`` asks more of it than it can do) in ``form`` (``flat``, ``two-level``), or
    None."""
    for c in costs:
        if (c.flat_busy if form == "flat" else c.two_level_busy) >= 1:
            return c.p
    return None
