"""The offline tools in bench/ that read a run's JSON: they must find what a run holds."""

import dataclasses
import importlib.util
import json
import os

import pytest

from commrt import sim
from commrt.algorithms.auto import candidates, label
from commrt.sim import Network, Overhead

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measured_on(net: Network, skew: dict | None) -> list[dict]:
    """Rows at 64 KiB and 1 MiB whose 2 × 2 candidates measured what ``net`` says (times
    ``skew[label]`` where given)."""
    rows = []
    for nbytes in (64 << 10, 1 << 20):
        measured = {
            label(a): sim.simulate(a, 4, nbytes, net).time_s * (skew or {}).get(label(a), 1.0)
            for a in candidates(4)
        }
        rows.append(dict(nbytes=nbytes, measured=measured | {"auto": 0.0}))
    return rows


def fake_run(alpha: float, skew: dict | None = None) -> dict:
    """A run of auto_vs_candidates.py on 2 × 2 hosts whose every candidate measured what the
    model says at ``alpha`` (times ``skew[label]`` where given)."""
    probe = dict(
        world_size=4, ranks_per_node=2, nics_per_node=1, alpha_s=9e-3, beta_s_per_byte=1e-9,
        inter_alpha_s=9e-3, inter_beta_s_per_byte=8e-9, gamma_s_per_byte=3e-11,
    )  # fmt: skip
    net = Network.from_probe(alpha, 1e-9, (alpha, 8e-9), 2, 1, 3e-11)
    return {"probe": probe, "rows": measured_on(net, skew)}


def test_the_hindsight_fit_finds_the_alpha_the_times_were_made_with(tmp_path, capsys):
    hs = load("model_hindsight")
    alpha = float(hs.ALPHAS[17])
    exact = fake_run(alpha)
    for row in exact["rows"]:
        got, worst, errs = hs.best_alpha(exact["probe"], row)
        assert (
            got == pytest.approx(alpha)
            and worst < 1e-9
            and set(errs) == set(row["measured"]) - {"auto"}
        )
    # a candidate 1.5× slower than the model can make it: no α fits everything
    skewed = fake_run(alpha, {"ring": 1.5})
    _, worst, _ = hs.best_alpha(skewed["probe"], skewed["rows"][0])
    assert worst > 0.1
    path = tmp_path / "2-0.json"
    path.write_text(json.dumps(skewed))
    assert hs.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "2x2 2-0.json" in lines[1] and all(len(x) <= 80 for x in lines)
    # a file that is not a run: a usage error naming it, not a traceback
    (tmp_path / "x.json").write_text("{}")
    for bad in (tmp_path / "x.json", tmp_path / "missing.json"):
        with pytest.raises(SystemExit) as e:
            hs.main([str(bad)])
        assert e.value.code == 2 and f"{bad} is not a JSON" in capsys.readouterr().err


def overhead_run(truth: Overhead, probed: Overhead, skew: dict | None = None) -> dict:
    """A 2 × 2 run whose candidates measured what the model says under ``truth`` (times
    ``skew[label]``), and whose probe measured ``probed``."""
    probe = fake_run(1e-3)["probe"] | dataclasses.asdict(probed)
    net = dataclasses.replace(Network.from_dict(probe), overhead=truth)
    return {"probe": probe, "rows": measured_on(net, skew)}


def test_the_hindsight_overheads_find_what_the_times_were_made_with(tmp_path, capsys):
    hs = load("model_hindsight")
    truth = Overhead(1.1e-3, 1.7e-3, 2.9e-3)
    run = overhead_run(truth, Overhead(0.8e-3, 1.2e-3, 3.5e-3))
    for row in run["rows"]:
        got, worst, errs = hs.best_overheads(run["probe"], row)
        assert worst < 0.01 and set(errs) == set(row["measured"]) - {"auto"}
    assert got.exchange_s == pytest.approx(truth.exchange_s, rel=0.02)  # 64 KiB: all overhead
    # recursive doubling 1.5× slower: its exchange steps are halving-doubling's and the 2 × 2
    # torus's too, so no overheads fit all three (the ring's alone, its shift_s would absorb)
    skewed = overhead_run(truth, truth, {"recursive_doubling": 1.5})
    _, worst, _ = hs.best_overheads(skewed["probe"], skewed["rows"][0])
    assert worst > 0.1
    path = tmp_path / "2-0.json"
    path.write_text(json.dumps(skewed))
    assert hs.main(["--overheads", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "shift/exch/multi" in lines[0] and all(len(x) <= 80 for x in lines)
    # a run whose probe measured no overheads: a usage error that says so
    path.write_text(json.dumps(fake_run(1e-3)))
    with pytest.raises(SystemExit) as e:
        hs.main(["--overheads", str(path)])
    assert e.value.code == 2 and "measured no per-step overheads" in capsys.readouterr().err


def test_the_goal_summary_counts_each_candidates_error_per_layout_and_size():
    goal = load("auto_goal")
    row = lambda errs: {"error": dict(errs, auto=9.0)}  # noqa: E731
    runs = {2: [[row({"a": 0.1, "b": -0.3})] * 4, [row({"a": -0.05, "b": 0.5})] * 4]}
    table = goal.error_summary(runs).splitlines()
    assert table[2] == "| 2 × 2 | 64 KiB | 2 of 4 | 20% |"  # |error| 0.05, 0.1, 0.3, 0.5
    assert table[-1].startswith("| 2 × 2 | 64 MiB | 2 of 4 |") and len(table) == 6


def test_the_calibration_spread_times_the_probes_calibration_again_and_again(capsys):
    from mp import mpiexec

    out = mpiexec(4, "../../bench/calibration_spread.py", "--backend", "mpi", "--times", "2",
                  "--repeats", "1", timeout=120).stdout.splitlines()  # fmt: skip
    assert out[0] == "# 4 ranks, mpi: ms per call of each calibration"
    assert [line.split()[0] for line in out[1:]] == ["1", "2", "kind", "exchange", "shift", "multi"]
    assert all(len(line) <= 80 for line in out)
    for line in out[-3:]:  # min ≤ median ≤ max, max/min ≥ 1
        lo, mid, hi, ratio = map(float, line.split()[1:])
        assert 0 < lo <= mid <= hi and ratio >= 1
    spread = load("calibration_spread")
    with pytest.raises(SystemExit) as e:
        spread.main(["--times", "1"])
    assert e.value.code == 2 and "--times must be at least 2" in capsys.readouterr().err


def test_the_noise_floor_times_every_candidate_twice_as_the_table_does(tmp_path):
    from mp import mpiexec

    path = tmp_path / "nf.json"
    out = mpiexec(2, "../../bench/noise_floor.py", "--backend", "mpi", "--size", "4K",
                  "--json", path, timeout=120).stdout.splitlines()  # fmt: skip
    assert out[0] == "# 2 ranks, 4096 B: each candidate twice, ms (median)"
    assert all(len(line) <= 80 for line in out)
    got = json.loads(path.read_text())
    assert (
        list(got["twice"]) == [label(a) for a in candidates(2)] == [r.split()[0] for r in out[2:]]
    )
    for line, (a, b) in zip(out[2:], got["twice"].values()):
        assert 0 < a and 0 < b and float(line.split()[-1]) == pytest.approx(b / a, abs=0.006)
