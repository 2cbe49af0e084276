"""What one process of the job stands on, below the communicator and its diagnosis.

:mod:`commrt.process.threads` (each rank's share of the node's cores, and the
rule commrt's own threads follow), :mod:`commrt.process.polling` (waiting on a
condition with growing pauses, up to a timeout), :mod:`commrt.process.rendezvous`
(the TCPStore every rank reaches, and MPI's world where ranks meet through it),
:mod:`commrt.process.environment` (rank and world size from the launcher's
variables) and :mod:`commrt.process.elastic` (what torchrun asks of a process:
its error file, and a SIGTERM that waits for the stall verdict).
"""
