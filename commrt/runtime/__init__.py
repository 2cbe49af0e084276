"""Who is there: the communicator and what it stands on.

:mod:`commrt.runtime.communicator` (``init``, ``Communicator``),
:mod:`commrt.runtime.connect` (making the transport ``init`` chose),
:mod:`commrt.runtime.slots` (``CommSlots``: what is derived once per communicator),
:mod:`commrt.runtime.syncs` (``OpenSyncs``: the GradientSyncs open on a communicator),
:mod:`commrt.runtime.choice` (which transport ``auto`` takes, for every caller),
:mod:`commrt.runtime.environment` (rank and world size from the launcher's
variables), :mod:`commrt.runtime.rendezvous` and :mod:`commrt.runtime.store`
(the TCPStore every rank reaches), :mod:`commrt.runtime.polling` (waiting on
the store with growing pauses, up to a timeout), :mod:`commrt.runtime.rows`
(every rank's small row of numbers on every rank: how ranks agree on anything),
:mod:`commrt.runtime.departures` (ranks that finished or closed, named to the
others), :mod:`commrt.runtime.abort` (ending the whole job when a rank fails),
:mod:`commrt.runtime.stall` (the stall watch: who is stuck and where, on every
rank), :mod:`commrt.runtime.frames` (which frames of a stack are the user's), :mod:`commrt.runtime.verdict` (the stall verdict as a pure function of
every rank's view), :mod:`commrt.runtime.elastic` (the verdict where torchrun
reads it: its error file, and a SIGTERM that waits for the verdict), :mod:`commrt.runtime.threads` (each rank's share of the
node's cores, and the rule commrt's own threads follow) and :mod:`commrt.runtime.trace` (Chrome-trace timelines and NVTX
ranges: what every layer above records, GradientSync and the torch backend).
"""
