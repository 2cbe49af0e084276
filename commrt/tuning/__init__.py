"""What ``auto`` knows of the network: the probe and the node layout.

:mod:`commrt.tuning.probe` measures α and β of this job's links (and saves
or loads a calibration), :mod:`commrt.tuning.probe_steps` times schedules for
it, :mod:`commrt.tuning.probe_checks` holds its sanity checks, and
:mod:`commrt.tuning.topology` is the node layout every rank agreed on.
"""
