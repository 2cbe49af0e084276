"""The gossip family: each bucket is mixed with ONE peer per step (GossipGraD).

Plain gossip exchanges through the communicator's schedules; gossip with a
deadline posts its messages and never waits past the deadline for a
partner, so it keeps its own mail, ledger, deaths log and rotation.

The package, one module per job (imports go down this list, never up):

==========================================  ==========================================
:mod:`~commrt.sync.gossip.policy`           :class:`GossipPolicy`: one peer per step
:mod:`~commrt.sync.gossip.deadline`         :class:`DeadlineGossipPolicy`: never wait past it
:mod:`~commrt.sync.gossip.rejoin`           who is in the rotation at each step
:mod:`~commrt.sync.gossip.deaths`           who died, locally then from the store
:mod:`~commrt.sync.gossip.mail`             its messages, posted and never waited on
:mod:`~commrt.sync.gossip.ledger`           what became of every gradient; the deadline's clock
==========================================  ==========================================
"""

from __future__ import annotations

from commrt.sync.gossip.deadline import DeadlineGossipPolicy
from commrt.sync.gossip.policy import GossipPolicy

__all__ = ["DeadlineGossipPolicy", "GossipPolicy"]
