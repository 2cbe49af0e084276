"""A wrapped transport is the transport it wraps: every trait reads the same through it.

:class:`~commrt.transports.base.Forwarding` is the base of the wrappers (the byte counter,
backup workers' gloo waiter, the tests' faults). Each field of a transport's
:class:`~commrt.transports.traits.Traits` decides a path somewhere (gossip polls a
``pollable`` transport, a farewell goes through the ``store``...), so a wrapper that
reported its own default would send a counted MPI transport down gloo's path.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from commrt.sync.backup.waiter import WaiterTransport
from commrt.transports.base import Traits, Transport
from commrt.transports.counting import CountingTransport
from commrt.transports.cuda_ipc import CudaIpcTransport
from commrt.transports.gloo import GlooRejoined, GlooTransport
from commrt.transports.mpi import MpiTransport
from commrt.transports.nccl import NcclTransport
from commrt.transports.shm import ShmTransport

ENGINES = [MpiTransport, GlooTransport, GlooRejoined, ShmTransport, NcclTransport, CudaIpcTransport]
#: the wrapper's own, on purpose: receives never add on arrival through its exchange(), and
#: it runs every schedule step by step (so that it sees every message: it never fuses the
#: one-shot)
OWN = {"adds_on_receive", "fuses_one_shot"}


def as_dict(traits: Traits) -> dict:
    return {f.name: getattr(traits, f.name) for f in dataclasses.fields(traits)}


def unbuilt(cls) -> Transport:
    """An instance of ``cls`` with its engine left out: the traits are what it declares,
    plus a store of its own (what its connect step sets)."""
    transport = cls.__new__(cls)
    Transport.__init__(transport, 0, 2, torch.device("cpu"))
    transport.store = object()
    return transport


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("wrap", [CountingTransport, lambda t: WaiterTransport(t, lambda: False)],
                         ids=["counting", "waiter"])  # fmt: skip
def test_a_wrapped_transport_reports_every_trait_of_its_engine(cls, wrap):
    inner = unbuilt(cls)
    wrapped = wrap(inner)
    theirs, ours = as_dict(inner.traits), as_dict(wrapped.traits)
    assert {k: v for k, v in ours.items() if k not in OWN} == {
        k: v for k, v in theirs.items() if k not in OWN
    }
    assert (wrapped.name, wrapped.store) == (inner.name, inner.store)
    assert not wrapped.traits.adds_on_receive and not wrapped.traits.fuses_one_shot


def test_a_counted_mpi_transport_is_pollable_as_gossip_asks():
    counted = CountingTransport(unbuilt(MpiTransport))
    assert counted.traits.pollable and counted.name == "mpi"


def test_traits_are_one_frozen_value():
    with pytest.raises(dataclasses.FrozenInstanceError):
        GlooTransport.traits.survives_peer_death = False


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_a_transport_is_what_its_backend_says_before_it_is_made(cls):
    """The command line asks a backend before any transport exists; the transport it makes
    declares the same traits (a replacement's differ by being one)."""
    from commrt.runtime.choice import Backend

    said = Backend(cls.name).traits
    assert cls.traits == (dataclasses.replace(said, rejoined=True) if cls.traits.rejoined else said)


def test_each_backend_declares_what_the_command_line_asks_of_it():
    """The command line and the process groups ask a backend's traits, never its name."""
    from commrt.runtime.choice import Backend

    assert {b.value for b in Backend if b.moves_cuda} == {"nccl", "cuda_ipc"}
    assert {b.value for b in Backend if b.started_by_mpiexec} == {"mpi"}
    assert {b.value for b in Backend if b.one_death_ends_all} == {"mpi"}
    assert {b.value for b in Backend if b.takes_a_replacement} == {"gloo"}
