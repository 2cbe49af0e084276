"""A wrapped transport is the transport it wraps: every trait reads the same through it.

:class:`~commrt.transports.base.Forwarding` is the base of the wrappers (the byte counter,
backup workers' gloo waiter, the tests' faults). Each trait a transport declares on
:class:`~commrt.transports.base.Transport` decides a path somewhere (gossip polls a
``pollable`` transport, a farewell goes through the ``store``...), so a wrapper that
reported its own default would send a counted MPI transport down gloo's path.
"""

from __future__ import annotations

import pytest
import torch

from commrt.sync.backup.waiter import WaiterTransport
from commrt.transports.base import Transport
from commrt.transports.counting import CountingTransport
from commrt.transports.cuda_ipc import CudaIpcTransport
from commrt.transports.gloo import GlooRejoined, GlooTransport
from commrt.transports.mpi import MpiTransport
from commrt.transports.nccl import NcclTransport
from commrt.transports.shm import ShmTransport

ENGINES = [MpiTransport, GlooTransport, GlooRejoined, ShmTransport, NcclTransport, CudaIpcTransport]
#: the wrapper's own, on purpose: receives never add on arrival through its exchange(), it
#: runs every schedule step by step (so that it sees every message: it never fuses the
#: one-shot), and the communicator attaches its record of departures to the transport it holds
OWN = {"adds_on_receive", "fuses_one_shot", "departures"}


def traits() -> list[str]:
    """Every trait Transport declares: its public class attributes that are not methods."""
    names = set(vars(Transport).get("__annotations__", {})) | {
        n for n, v in vars(Transport).items() if not n.startswith("_") and not callable(v)
    }
    return sorted(names - OWN)


def unbuilt(cls) -> Transport:
    """An instance of ``cls`` with its engine left out: the traits are what it declares,
    plus a store and a departure record of its own (what its connect step sets)."""
    transport = cls.__new__(cls)
    Transport.__init__(transport, 0, 2, torch.device("cpu"))
    transport.store = object()
    return transport


def test_every_trait_is_listed():
    assert {"name", "pollable", "stream_ordered", "store", "rejoined"} <= set(traits())


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("wrap", [CountingTransport, lambda t: WaiterTransport(t, lambda: False)],
                         ids=["counting", "waiter"])  # fmt: skip
def test_a_wrapped_transport_reports_every_trait_of_its_engine(cls, wrap):
    inner = unbuilt(cls)
    wrapped = wrap(inner)
    assert {t: getattr(wrapped, t) for t in traits()} == {t: getattr(inner, t) for t in traits()}
    assert wrapped.adds_on_receive is False


def test_a_counted_mpi_transport_is_pollable_as_gossip_asks():
    counted = CountingTransport(unbuilt(MpiTransport))
    assert counted.pollable and counted.name == "mpi"


def test_each_backend_declares_what_the_command_line_asks_of_it():
    """The command line and the process groups ask a backend's traits, never its name."""
    from commrt.runtime.choice import Backend

    assert {b.value for b in Backend if b.moves_cuda} == {"nccl", "cuda_ipc"}
    assert {b.value for b in Backend if b.started_by_mpiexec} == {"mpi"}
    assert {b.value for b in Backend if b.one_death_ends_all} == {"mpi"}
    assert {b.value for b in Backend if b.takes_a_replacement} == {"gloo"}
