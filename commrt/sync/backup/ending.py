"""The end of training under backup workers, run by ``BackupPolicy.close()``.

Ending is a role of its own beside the per-step protocol: the live ranks agree
on the last global step (a closing ticket at the step a rank holds), a rank
behind it catches up to it, and every rank answers the others' catch-up
requests until each live rank holds the final state or the timeout passes.
Where rank 0 hosts the control store, it then keeps the store up until every
live rank has said bye. The functions take the policy
(:class:`~commrt.sync.backup.policy.BackupPolicy`) and use its public
surface: where it stands (``held``, ``final``), its parts, and its
``serve``, ``catch_up``, ``counts`` and ``say_final``.
"""

from __future__ import annotations

import time

from commrt.runtime.store import Host


def end_training(policy) -> None:
    """End training at the step ``policy``'s rank holds, or catch up to where it ended."""
    arrival = policy.parts.arrival
    while policy.final is None or policy.held < policy.final:
        g = policy.held
        if policy.final is None:
            arrival.take(g, closing=True)
            if arrival.closes(arrival.first_n(g, policy.serve)):
                policy.final = g
                break
        policy.catch_up(policy.parts.catchup.request(g))
    policy.say_final()


def drain(policy) -> tuple[dict[int, dict], tuple[int, ...], float]:
    """End training, then serve until every live rank holds the final state (bounded by
    the policy's timeout). Returns what each rank that reached the end said (its counts),
    the ranks that did not, and the seconds it took."""
    parts, rank, p = policy.parts, policy.rank, policy.p
    start = time.monotonic()
    deadline = start + policy.timeout
    end_training(policy)
    others = [r for r in range(p) if r != rank]
    fins = wait_for_finals(policy.serve, parts, {rank: policy.counts()}, others, deadline)
    missing = tuple(r for r in range(p) if r not in fins)
    drained_s = time.monotonic() - start
    # the store may live in this process: keep it up until every live rank is done with it
    parts.liveness.stop()
    parts.liveness.say_bye()
    if parts.cs.where is Host.RANK0 and parts.cs.hosted_here:
        parts.liveness.wait_for_byes([r for r in others if r not in missing], deadline)
    return fins, missing, drained_s


def wait_for_finals(
    serve, parts, fins: dict[int, dict], others: list[int], deadline: float
) -> dict[int, dict]:
    """Answer catch-up requests (``serve``) until every live rank holds the final state
    (bounded by ``deadline``); add what each rank that does reported to ``fins``."""
    liveness, server = parts.liveness, parts.catchup.server
    while True:
        serve()
        liveness.read_finals(others, fins)
        waiting = [r for r in others if r not in fins and r not in liveness.missing]
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    while server.busy and time.monotonic() < deadline:
        server.drop_sends_to(liveness.missing)
        server.progress()
        time.sleep(0.002)
    return fins
