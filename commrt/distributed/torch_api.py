"""Every way commrt reaches into torch.distributed beyond calling its collectives.

commrt's backend is written in Python: it subclasses torch's ``ProcessGroup``
and ``Work``, registers itself with the extended factory API, and asks autograd
whether a backward pass is running. These lean on details that a torch release
may change, so they are gathered here; no other module of commrt imports
``torch._C`` or subclasses a torch class.

Tested on torch 2.11.0, 2.13.0, 2.14.1 and 2.15.0: the whole suite on 2.13.0,
the torch-facing tests on the others, 2.14.1 by hand before a release
(``.ci/matrix.toml``; tests/unit/test_torch_api.py checks that this list is
that matrix's).

What each use relies on:

* :data:`Work` (``torch.distributed.Work``): a Python subclass's ``wait()``,
  ``get_future()``, ``is_completed()``, ``is_success()`` and ``exception()``
  are what torch and DDP call. The subclass keeps its own state under one
  attribute, :data:`WORK_STATE`, never in attributes of its own: torch 2.14
  made ``Work.timeout`` a read-only property, and any other name may follow.
  :func:`names_torch_owns` lists what a release's ``Work`` defines, for the
  test that keeps the subclass clear of it.
* :class:`ProcessGroup` (a subclass of ``torch.distributed.ProcessGroup``):
  a Python subclass made by the backend's factory replaces the whole group;
  torch reads its name, description, rank and size through the methods it
  overrides. torch's Python code also asks a group for its backend on a
  device (``_get_backend``: from 2.15 ``batch_isend_irecv`` does, to see
  whether it coalesces); a group made this way has no backend behind it, so
  it answers itself.
* :func:`register_backend`: ``Backend.register_backend`` with
  ``extended_api=True`` (the factory gets the store, rank, size, timeout and
  group id in one options object) and ``devices`` (cpu and cuda both go to
  this one group).
* :func:`in_backward`: ``torch._C._current_graph_task_id()`` is -1 outside
  autograd's backward; there is no public way to ask.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

#: torch's Work, which :class:`commrt.distributed.work.CommrtWork` subclasses
Work = dist.Work
#: the one attribute a Work subclass of commrt's keeps its state under
WORK_STATE = "commrt"


class ProcessGroup(dist.ProcessGroup):
    """torch's ProcessGroup as a Python group that is its own backend on every device
    (:class:`commrt.distributed.group.NamedGroup` subclasses it)."""

    def _get_backend(self, device) -> ProcessGroup:
        """This group: it runs every device's calls itself. It declares no
        ``supports_coalescing``, so ``batch_isend_irecv`` issues each operation alone."""
        return self


def names_torch_owns() -> frozenset[str]:
    """Every name the installed torch's ``Work`` defines (methods and properties)."""
    return frozenset(dir(Work))


def register_backend(name: str, factory, devices: list[str]) -> None:
    """Register ``factory`` as the backend ``name`` for ``devices``, with the extended
    API: torch calls ``factory(backend_opts, pg_options)``."""
    dist.Backend.register_backend(name, factory, extended_api=True, devices=devices)


def in_backward() -> bool:
    """Whether the calling thread is inside autograd's backward pass."""
    return torch._C._current_graph_task_id() != -1
