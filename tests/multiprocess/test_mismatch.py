"""Mismatched collectives without COMMRT_DEBUG: each new call signature is agreed
across ranks once, so a mismatch is commrt's named error on every rank, on every
backend (not a C++ abort inside gloo, nor silently wrong math for equal sizes in
different shapes), and a repeated call exchanges nothing extra."""

import re

import pytest
import torch
from helpers.local_transport import run_ranks
from helpers.mp import gloo_ranks, mpiexec

import commrt
from commrt.collectives import core as collectives
from commrt.collectives.core import _Call
from commrt.errors import CollectiveMismatchError
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.transports.counting import CountingTransport


def _comm(tr, debug=False):
    info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
    return Communicator(tr, Backend.GLOO, info, 10, 1 << 20, debug=debug)


def _raises_on_every_rank(p, call):
    """Run ``call(comm)`` on ``p`` threads; each rank's CollectiveMismatchError text."""

    def body(tr):
        comm = _comm(tr)
        with pytest.raises(CollectiveMismatchError) as e:
            call(comm)
        # no data moved: the communicator still works
        assert commrt.all_reduce(torch.ones(2), comm, op="sum").tolist() == [p, p]
        return str(e.value)

    return run_ranks(p, body)


def test_sizes_that_differ_are_named_on_every_rank():
    msgs = _raises_on_every_rank(
        2, lambda c: commrt.all_reduce(torch.ones(1024 if c.rank == 0 else 1000), c)
    )
    for m in msgs:
        assert "shape=[1024]" in m and "shape=[1000]" in m, m
        assert "rank 0" in m and "rank 1" in m, m
        assert "different sizes" in m and "COMMRT_DEBUG" in m, m


def test_equal_sizes_in_different_shapes_are_named_on_every_rank():
    msgs = _raises_on_every_rank(
        2, lambda c: commrt.all_reduce(torch.ones((4, 8) if c.rank == 0 else (8, 4)), c)
    )
    for m in msgs:
        assert "shape=[4, 8]" in m and "shape=[8, 4]" in m, m
        assert "same number of elements" in m, m


@pytest.mark.parametrize(
    "call",
    [
        lambda c: commrt.all_reduce(torch.ones(8, dtype=torch.float64 if c.rank else None), c),
        lambda c: commrt.all_reduce(torch.ones(8), c, op="sum" if c.rank else "avg"),
        lambda c: commrt.all_reduce(torch.ones(8), c, algorithm="ring" if c.rank else "auto"),
        lambda c: commrt.broadcast(torch.ones(8 if c.rank else 9), c),
        lambda c: commrt.broadcast(torch.ones(8), c, root=c.rank % 2),
        lambda c: commrt.collectives.core.gather_rows(c, [1.0] * (3 + c.rank)),
        # shapes that differ only past the dimensions the row spells out
        lambda c: commrt.all_reduce(torch.ones([1] * 9 + [2 if c.rank else 1] + [1]), c),
    ],
    ids=["dtype", "op", "algorithm", "bcast-size", "bcast-root", "rows", "deep-shape"],
)
def test_every_part_of_the_signature_is_checked(call):
    for m in _raises_on_every_rank(3, call):
        assert "All calls: rank" in m and " called " in m, m


def test_the_agreement_row_has_one_width_whatever_the_call():
    widths = {
        len(_Call(k, s, d, "avg", "ring").row())
        for k in _Call.KINDS
        for s in [(), (5,), (2, 3), tuple(range(1, 20))]
        for d in (torch.float32, torch.int8, torch.complex64)
    }
    assert len(widths) == 1


def test_a_repeated_call_is_checked_once_and_exchanges_nothing_extra(monkeypatch):
    agreements = []
    exchange = collectives._exchange_rows

    def counted(comm, row, algorithm):
        agreements.append(comm.rank)
        return exchange(comm, row, algorithm)

    monkeypatch.setattr(collectives, "_exchange_rows", counted)

    def body(tr):
        counter = CountingTransport(tr)
        comm = _comm(counter)
        x = torch.ones(1000)
        commrt.all_reduce(x, comm, algorithm="ring", op="sum")
        first = counter.messages
        counter.reset()
        for _ in range(3):
            commrt.all_reduce(x, comm, algorithm="ring", op="sum")
        again = counter.messages
        assert comm.slots.agreed_calls == {("all_reduce", x.shape, x.dtype, False, "ring")}
        # a new shape is checked again, once
        commrt.all_reduce(torch.ones(10, 100), comm, algorithm="ring", op="sum")
        commrt.all_reduce(torch.ones(10, 100), comm, algorithm="ring", op="sum")
        return first, again

    (first, again), _ = run_ranks(2, body)
    assert first == again // 3 + 1  # the first call: one message to the peer, then the data
    assert sorted(agreements) == [0, 0, 1, 1]  # once per rank for each of the two shapes


def test_debug_mode_checks_every_call(monkeypatch):
    agreements = []
    exchange = collectives._exchange_rows
    monkeypatch.setattr(
        collectives,
        "_exchange_rows",
        lambda comm, row, alg: agreements.append(1) or exchange(comm, row, alg),
    )

    def body(tr):
        comm = _comm(tr, debug=True)
        for _ in range(3):
            commrt.all_reduce(torch.ones(8), comm)

    run_ranks(2, body)
    assert len(agreements) == 6


# ------------------------------------------------------------------ real ranks


def _spawn_gloo(n, *args, timeout=60):
    """Run mismatch_worker.py as ``n`` gloo ranks with torchrun's variables."""
    codes, outs = gloo_ranks(
        n, "mismatch_worker.py", *args, timeout=timeout, drop_env=("COMMRT_DEBUG",)
    )
    return codes, "".join(outs)


SIDES = {
    "size": ("shape=[1024]", "shape=[1000]"),
    "shape": ("shape=[4, 8]", "shape=[8, 4]"),
    "broadcast": ("shape=[1024]", "shape=[1000]"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
@pytest.mark.parametrize("case", ["size", "shape", "broadcast"])
def test_real_ranks_name_the_mismatch_without_debug_mode(backend, case, monkeypatch):
    monkeypatch.delenv("COMMRT_DEBUG", raising=False)
    if backend == "mpi":
        proc = mpiexec(2, "mismatch_worker.py", "mpi", case, timeout=60, check=False)
        codes, out = [proc.returncode], proc.stdout + proc.stderr
    else:
        codes, out = _spawn_gloo(2, "gloo", case)
    # not a timeout (60 s): each rank's own time to its error is held below, to 5 s, and not
    # the job's wall time, whose start-ups a busy machine stretches
    assert codes == [0] * len(codes), (codes, out)  # no SIGABRT, no abort
    assert "EnforceNotMet" not in out and "no error" not in out, out
    lines = [ln for ln in out.splitlines() if " raised after " in ln]
    assert sorted(ln.split()[1] for ln in lines) == ["0", "1"], out
    for ln in lines:
        assert float(re.search(r"after ([\d.]+) s", ln).group(1)) < 5.0, ln
        assert all(side in ln for side in SIDES[case]), ln
        assert "CollectiveMismatch" not in ln and "rank 0" in ln and "rank 1" in ln, ln
    assert sorted(re.findall(r"rank (\d) still works: 6", out)) == ["0", "1"], out


def test_a_repeat_beside_a_new_call_is_a_timeout_that_says_what_to_do():
    # the one case the first-use check cannot see: rank 0 repeats an agreed call while
    # rank 1 makes a new one. Their messages carry different tags, so neither pairs the
    # other's bytes with its own (no truncation, no gloo abort): both time out, and a
    # note on the checking rank's error points at COMMRT_DEBUG
    def body(tr):
        info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
        comm = Communicator(tr, Backend.GLOO, info, 1, 1 << 20)
        commrt.all_reduce(torch.ones(10), comm)
        with pytest.raises(commrt.CommTimeoutError) as e:
            commrt.all_reduce(torch.ones(10 if tr.rank == 0 else 12), comm)
        return e.value

    repeat, new = run_ranks(2, body)
    assert "algorithm ring, step 0" in str(new), new

    def notes(error):  # the short traceback's own note says nothing of the call
        return [n for n in getattr(error, "__notes__", []) if n != commrt.errors.SHORTENED]

    assert not notes(repeat), repeat.__notes__
    assert notes(new) == [collectives.CHECK_NOTE]
    assert "COMMRT_DEBUG=1" in collectives.CHECK_NOTE
