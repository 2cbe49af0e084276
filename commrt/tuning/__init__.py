"""What ``auto`` and the torus learn of the job: the probe, the node layout, and the
communicator the algorithms' hooks receive, through which they reach them.

:mod:`commrt.tuning.probe` measures α and β of this job's links (and saves
or loads a calibration), :mod:`commrt.tuning.probe_steps` times schedules for
it, :mod:`commrt.tuning.probe_checks` holds its sanity checks,
:mod:`commrt.tuning.topology` is the node layout every rank agreed on,
:mod:`commrt.tuning.memory` keeps ``auto``'s verdicts for later jobs of the same shape,
and :mod:`commrt.tuning.hook_comm` hands these to the algorithms' hooks (which never
import them) as the ``comm`` they receive.
"""
