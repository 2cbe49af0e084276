"""``commrt train --algorithm gossip --gossip-deadline``: the flag, and a killed rank."""

import re

import pytest
from helpers.cli import parse_error, parse_summary, run_commrt

from commrt.cli.commands import build_parser, check_train


def _algorithm(argv):
    args = build_parser().parse_args(argv)
    return check_train(args.parser, args).algorithm


@pytest.mark.parametrize("value, want", [("off", None), ("auto", "auto"), ("0.25", 0.25)])
def test_the_deadline_flag_reaches_gossip(value, want):
    alg = _algorithm(["train", "--algorithm", "gossip", "--gossip-deadline", value])
    assert alg.deadline_s == want and alg.family == (
        "gossip" if want is None else "gossip-deadline"
    )


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf"])
def test_a_bad_deadline_says_what_it_takes(value, capsys):
    line = parse_error(["train", "--algorithm", "gossip", "--gossip-deadline", value], capsys)
    assert "expected off, auto or a positive number of seconds" in line, line


@pytest.mark.slow
def test_gossip_with_a_deadline_carries_on_without_a_killed_rank():
    proc = run_commrt(
        "train", "--nproc", "4", "--algorithm", "gossip", "--gossip-deadline", "auto",
        "--kill", "1:5", "--epochs", "2", "--quiet", timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "rank 1 was killed by SIGKILL; the other ranks carried on" in out, out[-4000:]
    rows = parse_summary(proc.stdout)
    assert float(rows["final test accuracy"]) > 0.5, rows
    assert "gossip lost" in rows and "Traceback" not in out, out[-4000:]


@pytest.mark.slow
def test_deadline_composes_with_async_the_shuffle_and_the_epoch_average():
    """A straggler 20 ms late every step against a 10 ms deadline: its partners apply its
    messages late; the shards still swap and every epoch ends with the exact average."""
    proc = run_commrt(
        "train", "--nproc", "4", "--backend", "gloo", "--algorithm", "gossip",
        "--gossip-deadline", "0.01", "--gossip-async", "--straggler", "3:0.02",
        "--epochs", "2", "--quiet", timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = parse_summary(proc.stdout)
    assert "disagreement (‖θ_r−θ̄‖/‖θ̄‖)" in rows, rows  # average_parameters ran
    assert "async" in rows["algorithm"] and "deadline=0.01" in rows["algorithm"], rows
    sent, applied, late = (int(w) for w in re.findall(r"\d+", rows["gossip messages"]))
    assert late > 0 and applied <= sent, rows["gossip messages"]
    assert float(rows["final test accuracy"]) > 0.5, rows


@pytest.mark.slow
def test_a_killed_rank_is_replaced_and_rejoins_the_rotation():
    """--max-restarts 1: the launcher starts a replacement of the killed rank, which takes
    its state and step from a survivor and trains to the end with the others (they are
    slowed, 0.25 s a step, so that training lasts while it starts)."""
    proc = run_commrt(
        "train", "--nproc", "4", "--algorithm", "gossip", "--gossip-deadline", "auto",
        "--kill", "1:3", "--max-restarts", "1", "--epochs", "4", "--timeout", "60",
        "--straggler", "0:0.25,2:0.25,3:0.25", "--quiet", timeout=500,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "rank 1 was killed by SIGKILL; started a replacement (1 of 1)" in out, out[-4000:]
    assert "Traceback" not in out and "exited with status" not in out, out[-4000:]
    assert "nothing left to join" not in out, out[-4000:]
    rows = parse_summary(proc.stdout)
    assert rows.get("gossip rejoined", "").startswith("1 admitted"), rows
    assert float(rows["final test accuracy"]) > 0.5, rows
