"""Which :class:`~commrt.sync.policy.Policy` serves an algorithm.

An algorithm that offers a ``sync_policy()`` method chooses its own (a
family defined outside commrt needs nothing more); otherwise the first
entry of :data:`FAMILIES` whose algorithm types match serves it. Algorithms
stay plain data: they never import this package.
"""

from __future__ import annotations

from commrt.algorithms import Algorithm, BackupWorkers, Gossip
from commrt.sync.allreduce import AllReducePolicy
from commrt.sync.backup import BackupPolicy
from commrt.sync.gossip import GossipPolicy
from commrt.sync.policy import Policy

#: (algorithm types, policy class), first match wins; the all-reduce family serves any Algorithm
FAMILIES: tuple[tuple[tuple[type, ...], type[Policy]], ...] = (
    ((BackupWorkers,), BackupPolicy),
    ((Gossip,), GossipPolicy),
    ((Algorithm,), AllReducePolicy),
)


def policy_for(algorithm: Algorithm) -> Policy:
    """A fresh policy for ``algorithm`` (one per GradientSync: policies hold step state)."""
    offer = getattr(algorithm, "sync_policy", None)
    if callable(offer):
        policy = offer()
        if not isinstance(policy, Policy):
            raise TypeError(
                f"{type(algorithm).__name__}.sync_policy() must return a commrt.sync.Policy, "
                f"got {type(policy).__name__}"
            )
        return policy
    for types, cls in FAMILIES:
        if isinstance(algorithm, types):
            return cls(algorithm)
    raise TypeError(f"no GradientSync policy for {type(algorithm).__name__}")
