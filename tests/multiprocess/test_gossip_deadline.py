"""Gossip with a deadline on real gloo ranks: random per-rank delays, some several
deadlines long, and still every gradient reaches the model exactly once in total.

The ranks' gradients are integers (distinct per rank, step and element) and the
learning rate is 0, so every sum is exact in float64: over ranks and steps,
what was computed equals what ``wait()`` applied plus what the ledger held
unapplied at ``close()``, element by element."""

import os
import sys

import pytest
import torch
from helpers.mp import TESTS, gloo_ranks

sys.path.insert(0, os.path.join(TESTS, "workers"))
from gossip_deadline_worker import delay  # noqa: E402


def _run(tmp_path, n, mode, steps, *more):
    codes, outs = gloo_ranks(
        n, "gossip_deadline_worker.py", tmp_path, mode, steps, *more, timeout=300
    )
    return codes, outs


def _load(tmp_path, ranks):
    return [torch.load(tmp_path / f"rank{r}.pt") for r in ranks]


@pytest.mark.parametrize("n, mode", [(4, "sync"), (4, "dissemination"), (8, "sync"), (8, "async")])
def test_every_gradient_is_applied_exactly_once_in_total(tmp_path, n, mode):
    steps = 10
    assert any(delay(r, s) > 0.05 for r in range(n) for s in range(steps))  # some are late
    codes, outs = _run(tmp_path, n, mode, steps)
    assert codes == [0] * n, "\n".join(o[-3000:] for o in outs)
    ranks = _load(tmp_path, range(n))
    computed = sum(r["computed"] for r in ranks)
    applied = sum(r["applied"] for r in ranks)
    unapplied = sum(r["unapplied"] for r in ranks)
    assert torch.equal(computed, applied + unapplied), (computed - applied - unapplied).abs().max()
    ledgers = [r["ledger"] for r in ranks]
    for r, led in zip(ranks, ledgers):
        # the ledger's own totals are what the rank saw in .grad and what it computed
        assert led["computed"] == float(r["computed"].sum()), led
        assert led["applied"] == float(r["applied"].sum()), led
        assert led["lost"] == 0 and led["lost_sends"] == 0, led
    assert sum(led["sent"] for led in ledgers) == sum(led["received"] for led in ledgers)
    # the delays were past the deadline: some messages were applied at a later step
    assert sum(led["late"] for led in ledgers) > 0, ledgers
    lag = 1 if mode == "async" else 0
    stale = {k for led in ledgers for k in led["staleness"]}
    assert min(stale) == lag and max(stale) > lag, stale
    if mode == "async":  # the last step's own half is still held at close
        assert all(led["unapplied"] != 0 for led in ledgers)
