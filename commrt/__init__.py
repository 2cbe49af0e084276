"""commrt: a communication runtime for data-parallel training.

Example::

    import commrt
    comm = commrt.init(backend="auto")            # mpiexec / torchrun / alone
    commrt.all_reduce(tensor, comm, algorithm="ring", op="avg")
    commrt.broadcast(tensor, comm, root=0)
    commrt.average_parameters(model, comm)        # exact consensus; returns the disagreement
    sync = commrt.GradientSync(model, comm, algorithm="ring")   # in a training loop

Everything else lives in packages and modules with one job each:

* :mod:`commrt.errors`: the errors commrt raises, each named for what failed;
* :mod:`commrt.transports`: how bytes move between ranks (nccl, mpi, gloo, shared
  memory, CUDA IPC);
* :mod:`commrt.kernels`: the fused pack, unpack and reduce kernels;
* :mod:`commrt.schedule`: collectives as data, their symbolic checker, and the
  executor that runs a schedule on a transport (:mod:`commrt.schedule.executor`);
* :mod:`commrt.algorithms`: the algorithms, each a schedule generator;
* :mod:`commrt.sim`: the cost simulator, pricing schedules on a modelled network;
* :mod:`commrt.runtime`: the communicator (``init``) and what it stands on, among
  them the timelines of :mod:`commrt.runtime.trace`;
* :mod:`commrt.tuning`: what ``auto`` learns of the job (the probe, the node layout);
* :mod:`commrt.collectives`: the public collectives (``all_reduce``, ``broadcast``, ...);
* :mod:`commrt.training`: helpers for a training loop;
* :mod:`commrt.sync`: gradient synchronisation (:class:`GradientSync`);
* :mod:`commrt.distributed`: the torch.distributed backend ``"commrt"`` and DDP hooks;
* :mod:`commrt.data`: the public path of :class:`~commrt.data.GossipShuffle`;
* :mod:`commrt.cli`: the ``commrt`` command line, which :mod:`commrt.__main__`
  runs as ``python -m commrt``.
"""

import time as _time

#: when commrt was first imported in this process (``time.time()``): ``commrt train``'s
#: start-up is measured from here, importing torch included, and not from the process's
#: start, which a shell that ran something else first and then exec'd commrt shares
_imported_at = _time.time()

from commrt import data  # commrt.data.GossipShuffle
from commrt.collectives.consensus import average_parameters
from commrt.collectives.core import all_reduce, broadcast
from commrt.collectives.shards import all_gather, reduce_scatter
from commrt.distributed import register as _register_torch_backend
from commrt.errors import CommError, CommTimeoutError, PeerClosedError, ScheduleError
from commrt.runtime.communicator import Backend, Communicator, init
from commrt.schedule import Schedule
from commrt.sync.gradsync import GradientSync

_register_torch_backend()  # dist.init_process_group("commrt") works after `import commrt`

__version__ = "0.1.0"
__all__ = [
    "init",
    "Communicator",
    "Backend",
    "all_reduce",
    "broadcast",
    "reduce_scatter",
    "all_gather",
    "average_parameters",
    "GradientSync",
    "Schedule",
    "CommError",
    "CommTimeoutError",
    "PeerClosedError",
    "ScheduleError",
    "data",
]
