"""Which :class:`~commrt.sync.policy.Policy` serves an algorithm.

An algorithm's ``sync_policy()`` may return a policy of its own (a family
defined outside commrt needs nothing more); otherwise its ``family`` names
one in :data:`FAMILIES`. Both are declared on
:class:`~commrt.algorithms.Algorithm` (a policy of its own: none; family:
``"allreduce"``). Algorithms stay plain data: they never import this package.
"""

from __future__ import annotations

from commrt.algorithms import Algorithm
from commrt.sync.allreduce import AllReducePolicy
from commrt.sync.backup import BackupPolicy
from commrt.sync.gossip import DeadlineGossipPolicy, GossipPolicy
from commrt.sync.policy import Policy

#: an algorithm's ``family`` -> the policy class that serves it
FAMILIES: dict[str, type[Policy]] = {
    "allreduce": AllReducePolicy,
    "gossip": GossipPolicy,
    "gossip-deadline": DeadlineGossipPolicy,
    "backup": BackupPolicy,
}


def policy_for(algorithm: Algorithm) -> Policy:
    """A fresh policy for ``algorithm`` (one per GradientSync: policies hold step state)."""
    policy = algorithm.sync_policy()
    if policy is not None:
        if not isinstance(policy, Policy):
            raise TypeError(
                f"{type(algorithm).__name__}.sync_policy() must return a commrt.sync.Policy, "
                f"got {type(policy).__name__}"
            )
        return policy
    cls = FAMILIES.get(algorithm.family)
    if cls is None:
        raise TypeError(f"no GradientSync policy for {type(algorithm).__name__}")
    return cls(algorithm)
