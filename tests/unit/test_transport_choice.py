"""auto's one order (commrt.runtime.choice), and every text that says what auto picks.

The order is data (ORDER, in words) and code (fits); these tests hold the two together,
and hold the README, the docs, init's docstring and the command line's --help to the
sentence made from ORDER, so no page describes an order the code does not take.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from commrt.cli.commands import build_parser
from commrt.runtime import communicator
from commrt.runtime.choice import (
    LOCAL,
    ORDER,
    Backend,
    Situation,
    choose,
    cuda_transport_wanted,
    describe,
    fits,
)

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = Situation("cuda", "mpiexec", 4, 4, mpi_world=True)


def situations():
    """Every combination of what the choice depends on."""
    for device, launcher, (world, local), mpi, dies, nccl, shm in itertools.product(
        ("cpu", "cuda"),
        ("none", "torchrun", "mpiexec", "torch.distributed", LOCAL),
        ((1, 1), (4, 4), (4, 2), (4, None)),
        (False, True),
        (False, True),
        (None, "no CuPy"),
        (None, "no /dev/shm"),
    ):
        yield Situation(device, launcher, world, local, mpi, dies, nccl, shm)


def test_every_transport_has_its_place_in_the_order_once():
    assert [r.backend for r in ORDER] == [
        Backend.NCCL, Backend.CUDA_IPC, Backend.SHM, Backend.MPI, Backend.GLOO
    ]  # fmt: skip
    assert set(Backend) == {r.backend for r in ORDER}
    assert choose(EVERYTHING) == tuple(r.backend for r in ORDER)  # nothing excluded: all, in order


@pytest.mark.parametrize("s", list(situations()), ids=str)
def test_choose_keeps_the_order_and_ends_with_gloo(s):
    order = choose(s)
    assert order[-1] is Backend.GLOO
    assert list(order) == [r.backend for r in ORDER if fits(r.backend, s)]
    if s.ranks_may_die:
        assert order == (Backend.GLOO,)
    if Backend.NCCL in order:
        assert s.device == "cuda" and s.nccl_missing is None and order[0].moves_cuda


def test_under_torchrun_on_one_host_shared_memory_comes_first():
    torchrun = Situation("cpu", "torchrun", 4, 4)
    assert choose(torchrun) == (Backend.SHM, Backend.GLOO)
    # the launcher says the ranks span hosts: no attempt at shared memory
    assert choose(replace(torchrun, local_size=2)) == (Backend.GLOO,)
    # a process group's launch may not say: shared memory is tried, and may say no
    assert choose(replace(torchrun, local_size=None))[0] is Backend.SHM
    assert choose(replace(torchrun, shm_unusable="no /dev/shm")) == (Backend.GLOO,)
    assert choose(replace(torchrun, world_size=1, local_size=1)) == (Backend.GLOO,)


def test_under_mpiexec_shared_memory_then_mpi_then_gloo():
    mpi = Situation("cpu", "mpiexec", 4, 4, mpi_world=True)
    assert choose(mpi) == (Backend.SHM, Backend.MPI, Backend.GLOO)
    assert choose(replace(mpi, local_size=2)) == (Backend.MPI, Backend.GLOO)


def test_cuda_takes_nccl_where_it_is_installed_else_the_cpu_order():
    gpu = Situation("cuda", "torchrun", 2, 2)
    assert choose(gpu) == (Backend.NCCL, Backend.CUDA_IPC, Backend.SHM, Backend.GLOO)
    no_cupy = "pip install 'commrt[cuda12]'"
    assert choose(replace(gpu, nccl_missing=no_cupy, cuda_ipc_missing=no_cupy))[0] is Backend.SHM


def test_cuda_ipc_needs_cupy_but_not_nccl():
    gpu = Situation("cuda", "torchrun", 4, 4)
    no_nccl = replace(gpu, nccl_missing="CuPy could not load libnccl")
    assert choose(no_nccl)[:2] == (Backend.CUDA_IPC, Backend.SHM)
    no_runtime = replace(gpu, cuda_ipc_missing="needs CUDA through CuPy")
    assert choose(no_runtime)[:3] == (Backend.NCCL, Backend.SHM, Backend.GLOO)
    asked = replace(no_runtime, cuda_transport="cuda_ipc")
    assert Backend.CUDA_IPC not in choose(asked)


def test_cuda_takes_cuda_ipc_where_ranks_share_a_gpu_or_it_is_asked_for():
    gpu = Situation("cuda", "torchrun", 4, 4)
    shared = replace(gpu, gpu_shared=True)  # NCCL refuses two ranks on one GPU
    assert choose(shared)[:2] == (Backend.CUDA_IPC, Backend.SHM)
    assert choose(replace(gpu, cuda_transport="cuda_ipc"))[0] is Backend.CUDA_IPC
    assert choose(replace(shared, cuda_transport="nccl"))[0] is Backend.NCCL  # as asked
    assert Backend.CUDA_IPC not in choose(replace(gpu, local_size=2))  # across hosts
    no_cupy = replace(shared, nccl_missing="no CuPy", cuda_ipc_missing="no CuPy")
    assert Backend.CUDA_IPC not in choose(no_cupy)
    assert choose(replace(gpu, world_size=1, local_size=1))[0] is Backend.NCCL


def test_the_cuda_transport_variable_is_checked():
    assert cuda_transport_wanted({}) == "auto"
    assert cuda_transport_wanted({"COMMRT_CUDA_TRANSPORT": " CUDA_IPC "}) == "cuda_ipc"
    with pytest.raises(ValueError, match="COMMRT_CUDA_TRANSPORT='ipc' is none of"):
        cuda_transport_wanted({"COMMRT_CUDA_TRANSPORT": "ipc"})


def test_the_sentence_names_each_transport_in_the_order():
    text = describe()
    at = [
        text.index(f" {b} " if b is not Backend.GLOO else f" {b};")
        for b in (r.backend for r in ORDER)
    ]
    assert at == sorted(at), text
    for backend, where in ((r.backend, r.where) for r in ORDER):
        assert f"{backend} {where}".strip() in text
    assert describe(markdown=True).replace("`", "") == text


def _flat(text: str) -> str:
    """``text`` with code marks and line breaks gone (Markdown, reST or --help wrapping)."""
    return " ".join(text.replace("`", "").split())


#: the pages that say what auto picks, each in the one sentence
CARRY_THE_SENTENCE = ("README.md", "docs/install.md", "docs/quickstart.md", "docs/shared-memory.md")


@pytest.mark.parametrize("page", CARRY_THE_SENTENCE)
def test_pages_that_say_what_auto_picks_carry_the_sentence(page):
    assert _flat(describe()) in _flat((ROOT / page).read_text(encoding="utf-8")), page


def test_inits_docstring_carries_the_sentence():
    assert _flat(describe()) in _flat(communicator.init.__doc__)


@pytest.mark.parametrize("command", [["train"], ["bench", "allreduce"], ["probe"]])
def test_the_backend_flags_help_is_the_sentence(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    assert _flat(describe()) in _flat(capsys.readouterr().out)


#: a sentence about auto that names transports with "else": an order being told
NAMES = re.compile(r"\b(nccl|shm|shared memory|mpi|gloo)\b", re.IGNORECASE)
TOLD = re.compile(r"\bauto\b(?!\|).*\b(else|otherwise|falls back)\b", re.IGNORECASE)
#: where a sentence ends: a full stop, a list item (a table's row is one sentence)
SENTENCE_END = re.compile(r"(?<=\.)\s+|\s+- ")


def orders_told(text: str):
    """(sentence, transports in the order named after "auto") for every sentence of
    ``text`` that tells an order of transports for auto."""
    for para in re.split(r"\n\s*\n", text):
        table = para.lstrip().startswith("|")
        for sentence in para.splitlines() if table else SENTENCE_END.split(_flat(para)):
            told = TOLD.search(sentence)
            if told is None:
                continue
            named = [m.group(1).lower() for m in NAMES.finditer(sentence, told.start())]
            named = list(dict.fromkeys(n.replace("shared memory", "shm") for n in named))
            if len(named) >= 2:
                yield sentence, named


def test_the_order_finder_sees_a_wrong_order():
    wrong = "With `auto`: nccl with a GPU, else mpi if installed, else gloo.\n\nshm is fast."
    (_, named), (_, gloo_first) = orders_told(wrong + "\n\nauto: gloo, else shm")
    assert named == ["nccl", "mpi", "gloo"] and gloo_first == ["gloo", "shm"]


def test_no_page_tells_another_order():
    rank = {str(r.backend): i for i, r in enumerate(ORDER)}
    bad = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for para, named in orders_told(page.read_text(encoding="utf-8")):
            if [rank[n] for n in named] != sorted(rank[n] for n in named):
                bad.append(f"{page.relative_to(ROOT)}: {para[:160]}")
    assert not bad, "an order of transports other than auto's:\n" + "\n".join(bad)


def test_the_map_names_the_chooser_where_a_new_transport_goes():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    new_transport = _flat(text.split("- **A new transport**", 1)[1].split("\n- **", 1)[0])
    chooser = choose.__module__.replace(".", "/") + ".py"
    for name in (chooser, "ORDER", "Row"):
        assert name in new_transport, name


def backend_table() -> str:
    """ORDER as the Markdown table docs/ARCHITECTURE.md shows: a row per backend, in auto's
    order, with where auto takes it, its true traits and its engine's own all-reduce."""
    lines = [
        "| # | backend | auto takes it | what it is (its `Traits`) | its own all-reduce |",
        "|---|---|---|---|---|",
    ]
    for i, row in enumerate(ORDER, 1):
        true = [f"`{f.name}`" for f in fields(row.traits) if getattr(row.traits, f.name)]
        where = row.where or "everywhere"
        lines.append(
            f"| {i} | `{row.backend.value}` | {where} | {', '.join(true) or '—'} | {row.native} |"
        )
    return "\n".join(lines)


def test_the_architecture_page_shows_the_backend_table_as_it_is():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert backend_table() in page, "docs/ARCHITECTURE.md's backend table:\n" + backend_table()


def test_a_replacement_is_made_by_the_row_of_a_backend_that_takes_one(monkeypatch):
    """``COMMRT_REJOIN=1``: the first backend's row makes the replacement's transport, with
    no store (the job's group does not reach it); a backend that takes none is refused,
    the error naming those that do (read from the table, never a name in code)."""
    from types import SimpleNamespace

    from commrt import settings
    from commrt.runtime.connect import make_transport

    monkeypatch.setenv(settings.REJOIN.name, "1")
    launch = SimpleNamespace(launcher="torchrun", master_port=None, local_rank=0)
    able = [b for b in Backend if b.takes_a_replacement]
    assert able, "no backend takes a replacement"
    for be in Backend:
        if be.takes_a_replacement:
            made_on, transport = make_transport((be,), launch, 1, 2, 5.0, (None, None), None)
            assert made_on is be and transport.traits.rejoined and transport.store is None
        else:
            with pytest.raises(ValueError, match=f"pass backend='{able[0]}'"):
                make_transport((be,), launch, 1, 2, 5.0, (None, None), None)
