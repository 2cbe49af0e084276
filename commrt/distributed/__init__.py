"""commrt inside torch.distributed: the ``"commrt"`` backend and DDP hooks.

Example::

    import commrt                        # registers the backend
    import torch.distributed as dist
    dist.init_process_group("commrt")    # COMMRT_ALGORITHM=auto|ring|torus2d|...
    model = torch.nn.parallel.DistributedDataParallel(model)
    ...
    print(commrt.distributed.stats())    # what each call ran, and why

Rooms: :mod:`~commrt.distributed.register` (the backend name and the group
factory), :mod:`~commrt.distributed.devices` (a communicator per device
type, :class:`Options`), :mod:`~commrt.distributed.group` (the process
group), :mod:`~commrt.distributed.dispatch` (where and how a call runs),
:mod:`~commrt.distributed.ops` (what each call runs),
:mod:`~commrt.distributed.work` (works, futures, the call thread,
errors), :mod:`~commrt.distributed.torch_api` (what the backend relies on
of torch beyond its collectives, and the torch versions it is tested on),
:mod:`~commrt.distributed.observe` (what the calls ran: stats,
``COMMRT_LOG``, ``COMMRT_TRACE``) and :mod:`~commrt.distributed.hooks` (DDP
communication hooks: commrt all-reduce on any backend, GossipGraD).
"""

import importlib as _importlib
import typing as _typing

from commrt.distributed.register import BACKEND_NAME, register

register()  # (torch is imported by now; ``import commrt`` registers where it came first)

#: the other public names and their modules, imported on first use: registering the
#: backend (``import commrt`` does, once torch is imported) needs none of them
_PUBLIC = {
    "Options": "commrt.distributed.devices",
    "stats": "commrt.distributed.group",
    "GroupStats": "commrt.distributed.observe",
    "CallStats": "commrt.distributed.observe",
}
__all__ = ["BACKEND_NAME", "register", "Options", "stats", "GroupStats", "CallStats"]

if _typing.TYPE_CHECKING:  # what readers and tools follow (the API pages, type checkers)
    from commrt.distributed.devices import Options
    from commrt.distributed.group import stats
    from commrt.distributed.observe import CallStats, GroupStats


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'commrt.distributed' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
