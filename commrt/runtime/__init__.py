"""Who is there: the communicator and what it stands on.

:mod:`commrt.runtime.communicator` (``init``, ``Communicator``),
:mod:`commrt.runtime.choice` (which transport ``auto`` takes, for every caller),
:mod:`commrt.runtime.environment` (rank and world size from the launcher's
variables), :mod:`commrt.runtime.rendezvous` and :mod:`commrt.runtime.store`
(the TCPStore every rank reaches), :mod:`commrt.runtime.departures` (ranks
that finished or closed, named to the others) and
:mod:`commrt.runtime.threads` (each rank's share of the node's cores).
"""
