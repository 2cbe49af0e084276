"""Failure diagnosis: who failed, who is stuck and where, said once on every rank.

:mod:`commrt.diagnosis.departures` (ranks that finished or closed, named to the
others: a farewell), :mod:`commrt.diagnosis.abort` (ending the whole job when a
rank fails), :mod:`commrt.diagnosis.failures` (what a failed call tells the
peers and the verdict before its error is raised), :mod:`commrt.diagnosis.stall` (the stall watch: a thread per
communicator that beats and notices a stall), :mod:`commrt.diagnosis.hearing`
(every rank's view gathered, the missing ones made up, one verdict for all),
:mod:`commrt.diagnosis.telling` (the verdict printed, dumped and written where
torchrun reads it), :mod:`commrt.diagnosis.verdict` (the verdict as a pure
function of every rank's view) and :mod:`commrt.diagnosis.frames` (which frames
of a stack are the user's).

It stands on :mod:`commrt.process` (threads, waits, the store) and the schedule
(where a rank is); the communicator (:mod:`commrt.runtime`) starts it.
"""
