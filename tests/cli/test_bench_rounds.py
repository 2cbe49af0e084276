"""``commrt bench allreduce`` times every row of a size in alternated rounds
(commrt.cli.bench.time_alternated): a slow stretch of the machine meets every algorithm
alike, instead of falling on one algorithm's runs, which ran back to back before."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from commrt.cli import bench


def test_each_round_runs_every_row_once_every_other_round_reversed(monkeypatch):
    ran, barriers = [], []
    comm = SimpleNamespace(device=torch.device("cpu"), barrier=lambda: barriers.append(len(ran)))
    fns = [lambda name=name: ran.append(name) for name in "abc"]
    bench.time_alternated(comm, fns, iters=2, repeats=3)
    warm, timed = ran[:3], ran[3:]
    assert warm == list("abc")  # one untimed call each, first
    runs = [timed[i] for i in range(0, len(timed), 2)]  # each run is 2 calls of one row
    assert runs == list("abc") + list("cba") + list("abc")
    assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))
    assert len(barriers) == 9  # every run starts at a barrier


def test_each_figure_is_the_median_of_its_rounds(monkeypatch):
    clock = iter([0.0, 1.0, 1.0, 1.5, 1.5, 4.5, 4.5, 5.0, 5.0, 6.0, 6.0, 6.5])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    comm = SimpleNamespace(device=torch.device("cpu"), barrier=lambda: None)
    # rounds a, b | b, a | a, b: a's runs take 1, 0.5 and 1 s; b's 0.5, 3 (a slow stretch)
    # and 0.5 s
    a, b = bench.time_alternated(comm, [lambda: None, lambda: None], iters=1, repeats=3)
    assert (a, b) == (1.0, 0.5)
