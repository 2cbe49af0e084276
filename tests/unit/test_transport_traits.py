"""A wrapped transport is the transport it wraps: every trait reads the same through it.

:class:`~commrt.transports.base.Forwarding` is the base of the wrappers (the byte counter,
backup workers' gloo waiter, the tests' faults). Each trait a transport declares on
:class:`~commrt.transports.base.Transport` decides a path somewhere (gossip polls a
``pollable`` transport, a farewell goes through the ``store``...), so a wrapper that
reported its own default would send a counted MPI transport down gloo's path.
"""

from __future__ import annotations

import ast

import pytest
import torch
from helpers.layout import ROOT, library_sources

from commrt.sync.backup.waiter import WaiterTransport
from commrt.transports.base import Transport
from commrt.transports.counting import CountingTransport
from commrt.transports.cuda_ipc import CudaIpcTransport
from commrt.transports.gloo import GlooRejoined, GlooTransport
from commrt.transports.mpi import MpiTransport
from commrt.transports.nccl import NcclTransport
from commrt.transports.shm import ShmTransport

ENGINES = [MpiTransport, GlooTransport, GlooRejoined, ShmTransport, NcclTransport, CudaIpcTransport]
#: the wrapper's own, on purpose: receives never add on arrival through its exchange(), and
#: the communicator attaches its record of departures to the transport it holds
OWN = {"adds_on_receive", "departures"}


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


#: the names transports and backends go by
NAMES = {"mpi", "gloo", "shm", "nccl", "cuda_ipc"}
#: where a name is still compared: the command line's own --backend flag (a user's word, not a
#: transport) and the torch backend's cpu_transport option. Each should become a trait
#: declared on commrt.runtime.choice.Backend; the count here may only go down
COMPARED_STILL = {
    "commrt/cli/commands.py": 5,
    "commrt/cli/train.py": 1,
    "commrt/cli/train_faults.py": 1,
    "commrt/distributed/devices.py": 1,
}


def names_compared(source: str) -> int:
    """How many comparisons (``==``, ``!=``, ``in``) hold a transport's or backend's name
    as a string literal."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literals = [
            e.value
            for side in sides
            for e in (side.elts if isinstance(side, (ast.Tuple, ast.Set, ast.List)) else [side])
            if isinstance(e, ast.Constant)
        ]
        count += any(v in NAMES for v in literals)
    return count


def test_the_name_check_sees_a_comparison():
    assert names_compared('if t.name == "gloo" or b in ("mpi", "cuda_ipc"): pass') == 2
    assert names_compared('if t.survives_peer_death and x == "ring": pass') == 0


def test_no_transport_is_told_by_its_name():
    """What a transport is, it declares (a trait on Transport, asked as NCCL asks each
    transport canConnect); runtime/choice.py alone maps names to backends."""
    found = {}
    for _, path in library_sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel != "commrt/runtime/choice.py" and (n := names_compared(path.read_text("utf-8"))):
            found[rel] = n
    assert {f: n for f, n in found.items() if n > COMPARED_STILL.get(f, 0)} == {}, found
