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
* :mod:`commrt.settings`: every environment variable and time bound, each declared
  once (``docs/configuration.md`` is written from them);
* :mod:`commrt.transports`: how bytes move between ranks (nccl, mpi, gloo, shared
  memory, CUDA IPC);
* :mod:`commrt.kernels`: the fused pack, unpack and reduce kernels;
* :mod:`commrt.schedule`: collectives as data, their symbolic checker, and the
  executor that runs a schedule on a transport (:mod:`commrt.schedule.executor`);
* :mod:`commrt.algorithms`: the algorithms, each a schedule generator;
* :mod:`commrt.sim`: the cost simulator, pricing schedules on a modelled network;
* :mod:`commrt.process`: what one process stands on (its threads, its waits, the
  store its ranks meet in, what its launcher gave it);
* :mod:`commrt.diagnosis`: a failure's diagnosis (a rank's farewell, the abort,
  the stall watch and its one verdict on every rank);
* :mod:`commrt.runtime`: the communicator (``init``), the table of backends, and
  the timelines of :mod:`commrt.runtime.trace`;
* :mod:`commrt.tuning`: what ``auto`` learns of the job (the probe, the node layout);
* :mod:`commrt.collectives`: the public collectives (``all_reduce``, ``broadcast``, ...);
* :mod:`commrt.training`: helpers for a training loop;
* :mod:`commrt.sync`: gradient synchronisation (:class:`GradientSync`);
* :mod:`commrt.distributed`: the torch.distributed backend ``"commrt"`` and DDP hooks;
* :mod:`commrt.data`: the public path of :class:`~commrt.data.GossipShuffle`;
* :mod:`commrt.testing`: stand-ins for the device transports' engines, plugged in by
  tests (never ``init``'s arguments);
* :mod:`commrt.cli`: the ``commrt`` command line, which :mod:`commrt.__main__`
  runs as ``python -m commrt``.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys
import time as _time
import typing as _typing

#: when commrt was first imported in this process (``time.time()``): ``commrt train``'s
#: start-up is measured from here, importing torch included, and not from the process's
#: start, which a shell that ran something else first and then exec'd commrt shares
_imported_at = _time.time()

__version__ = "0.1.0"

#: each public name and the module that defines it. They are imported on first use (PEP
#: 562): ``import commrt`` itself imports no torch, so ``commrt --help`` answers at once
_PUBLIC = {
    "init": "commrt.runtime.communicator",
    "Communicator": "commrt.runtime.communicator",
    "Backend": "commrt.runtime.choice",
    "all_reduce": "commrt.collectives.core",
    "broadcast": "commrt.collectives.core",
    "reduce_scatter": "commrt.collectives.shards",
    "all_gather": "commrt.collectives.shards",
    "average_parameters": "commrt.collectives.consensus",
    "GradientSync": "commrt.sync.gradsync",
    "Schedule": "commrt.schedule",
    "CommError": "commrt.errors",
    "CommTimeoutError": "commrt.errors",
    "PeerClosedError": "commrt.errors",
    "ScheduleError": "commrt.errors",
    "data": None,  # the module commrt.data itself (GossipShuffle)
}
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

if _typing.TYPE_CHECKING:  # what readers and tools follow (the API pages, type checkers)
    from commrt import data
    from commrt.collectives.consensus import average_parameters
    from commrt.collectives.core import all_reduce, broadcast
    from commrt.collectives.shards import all_gather, reduce_scatter
    from commrt.errors import CommError, CommTimeoutError, PeerClosedError, ScheduleError
    from commrt.runtime.choice import Backend
    from commrt.runtime.communicator import Communicator, init
    from commrt.schedule import Schedule
    from commrt.sync.gradsync import GradientSync


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'commrt' has no attribute {name!r}")
    module = _PUBLIC[name]
    value = _importlib.import_module(f"commrt.{name}" if module is None else module)
    value = value if module is None else getattr(value, name)
    globals()[name] = value  # once: later reads find it here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _register_torch_backend() -> None:
    """Register the ``"commrt"`` torch.distributed backend (idempotent). Where torch is
    being imported by :mod:`commrt.distributed`'s own import (``import
    commrt.distributed`` came first), that import registers it once done."""
    importing = _sys.modules.get("commrt.distributed.register")
    if importing is not None and not hasattr(importing, "register"):
        return
    from commrt.distributed.register import register

    register()


class _AfterTorch:
    """Registers the backend once torch has been imported, where ``import commrt`` came
    first (as isort orders them): ``dist.init_process_group("commrt")`` then works with no
    commrt name touched. A finder on ``sys.meta_path`` that answers only for ``torch``,
    once, and removes itself; torch's own loader runs, then the registration."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        _sys.meta_path.remove(self)
        spec = _importlib_util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRegister(spec.loader)
        return spec


class _ThenRegister:
    """A loader that runs ``loader`` and then registers the backend; any other attribute
    is ``loader``'s (torch's resources, its source)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _register_torch_backend()

    def __getattr__(self, name: str):
        return getattr(self.loader, name)


if "torch" in _sys.modules:  # torch is here already: register now, as torch users expect
    _register_torch_backend()
else:
    _sys.meta_path.insert(0, _AfterTorch())
