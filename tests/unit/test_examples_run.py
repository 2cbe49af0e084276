"""Every ``>>>`` example in the library runs, as doctest runs it.

Each module of commrt/, algorithms/ and kernels/ whose docstrings hold an example is
doctested in a world of one: ``comm`` is a one-rank communicator, the default
torch.distributed group a one-rank ``"commrt"`` group, and ``torch``, ``commrt`` and
``dist`` are imported. An example that needs several ranks or a GPU says so with
``# doctest: +SKIP`` on each line it cannot run here.
"""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch
import torch.distributed as dist
from helpers.layout import library_sources

import commrt

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def modules_with_examples() -> list[str]:
    return [name for name, path in library_sources() if ">>> " in path.read_text("utf-8")]


@pytest.fixture(scope="module")
def world_of_one():
    """The names the examples use: a one-rank communicator and default group."""
    comm = commrt.init("gloo", rank=0, world_size=1)
    dist.init_process_group("commrt", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield {"torch": torch, "commrt": commrt, "dist": dist, "comm": comm}
    finally:
        dist.destroy_process_group()
        comm.close()


def test_the_scan_finds_the_modules_with_examples():
    found = modules_with_examples()
    assert len(found) > 25 and "commrt.collectives.core" in found and "commrt.kernels" in found


@pytest.mark.parametrize("name", modules_with_examples())
def test_the_examples_run(name, world_of_one):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs=world_of_one, optionflags=FLAGS, report=True)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
