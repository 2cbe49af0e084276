"""Who is there: the communicator, and how it is made.

:mod:`commrt.runtime.communicator` (``init``, ``Communicator``),
:mod:`commrt.runtime.connect` (making the transport ``init`` chose),
:mod:`commrt.runtime.choice` (the table of backends: which one ``auto`` takes,
for every caller), :mod:`commrt.runtime.slots` (``CommSlots``: what is derived
once per communicator), :mod:`commrt.runtime.open_syncs` (``OpenSyncs``: the
GradientSyncs open on a communicator), :mod:`commrt.runtime.store` (the job's
store, reached by every rank), :mod:`commrt.runtime.rows` (every rank's small
row of numbers on every rank: how ranks agree on anything) and
:mod:`commrt.runtime.trace` (Chrome-trace timelines and NVTX ranges: what every
layer above records, GradientSync and the torch backend).

What it stands on is :mod:`commrt.process`; a failure's diagnosis (the stall
watch, the verdict, a rank's farewell, the abort) is :mod:`commrt.diagnosis`.
"""
