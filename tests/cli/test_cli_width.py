"""Every table commrt prints fits an 80-column terminal: bench allreduce, bench
kernels, simulate and the launcher's lines, and every command's --help; the detail the
tables leave out goes to --csv and --json; the default bench sweep stays small."""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys

import pytest
from helpers.cli import run_in_pty

from commrt.cli import bench, main
from commrt.cli.commands import build_parser
from commrt.cli.launch import tolerated_lines
from commrt.runtime.choice import ORDER

COMMRT = [sys.executable, "-m", "commrt"]


def _fits(out: str, cols: int = 80) -> list[str]:
    """The printed lines (carriage-return redraws split), each checked against ``cols``
    and for a stray warning: bench's in-place sums of ones once overflowed to inf and
    numpy's warning, with the checkout's path in it, broke the table (CI's path was
    longer than ours, so only CI saw it run past 80 columns)."""
    lines = [f for ln in out.replace("\r\n", "\n").split("\n") for f in ln.split("\r")]
    for line in lines:
        assert len(line.rstrip()) <= cols, f"{len(line.rstrip())} columns: {line!r}"
        assert "Warning" not in line, line
    return lines


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        pytest.param(
            "mpi",
            marks=[
                pytest.mark.skipif(not shutil.which("mpiexec"), reason="no mpiexec"),
                pytest.mark.slow,
            ],
        ),
    ],
)
def test_bench_allreduce_fits_80_columns_and_writes_the_detail(backend, tmp_path):
    csv_path, json_path = tmp_path / "ar.csv", tmp_path / "ar.json"
    argv = [*COMMRT, "bench", "allreduce", "--nproc", "2", "--backend", backend]
    # the files by the names a user in that folder gives: "# wrote ar.csv" is the program's
    # own line, while a temporary folder's path (longer under xdist) is not its layout
    argv += ["--sizes", "8,64K", "--repeats", "1", "--csv", csv_path.name]
    argv += ["--json", json_path.name]
    rc, out = run_in_pty(argv, cwd=tmp_path)
    assert rc == 0, out[-3000:]
    lines = _fits(out)
    assert lines[0].startswith(f"starting 2 ranks ({backend})"), lines[:3]
    assert "busbw GB/s" in out and "time µs" in out and "64 KiB" in out
    # 2 sizes × (5 default algorithms + the anchors: gloo's all-reduce, and MPI_Allreduce
    # where mpi4py is installed), every column the table drops kept
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    per_size = len(rows) // 2
    assert per_size in (6, 7) and {"count", "time_us", "algbw_GBps", "busbw_GBps"} <= set(rows[0])
    assert rows[0]["bytes"] == "8" and rows[0]["count"] == "2"
    recs = json.loads(json_path.read_text())
    assert [r["algorithm"] for r in recs] == [r["algorithm"] for r in rows]
    gloo = recs[5]
    assert "gloo allreduce" in gloo["algorithm"] and gloo["x_gloo"] == 1.0
    if per_size == 7:
        assert "MPI_Allreduce" in recs[6]["algorithm"] and recs[6]["x_mpi"] == 1.0


def test_every_native_baselines_name_shows_whole_within_80_columns():
    """The baseline's row names the engine's own all-reduce whole: 'native (shm rank-order
    s' was cut by a 24-column name."""
    for name in (row.native for row in ORDER):
        result = bench.Result(f"native ({name})", 1e-4)
        row = bench.Row(1 << 20, 1 << 18, [bench.Result("ring", 2e-4), result])
        lines = bench.table_row(row, 4).splitlines()
        assert f"native ({name}) " in lines[1] and all(len(x) <= 80 for x in lines), lines
    assert all(len(x) <= 80 for x in bench.table_header(["ring"], 4, "title").splitlines())


def test_bench_kernels_fits_80_columns(tmp_path):
    csv_path = tmp_path / "k.csv"
    argv = [*COMMRT, "bench", "kernels", "--sizes", "1M", "--device", "cpu"]
    rc, out = run_in_pty([*argv, "--csv", csv_path.name], cwd=tmp_path)
    assert rc == 0, out[-3000:]
    _fits(out)
    assert "pack/copy" in out and "1 MiB" in out and "copy GB/s" in out
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [r["op"] for r in rows] == list(bench.KERNEL_OPS) and rows[0]["count"] == "262144"


@pytest.mark.slow
def test_simulate_fits_80_columns_and_writes_json(tmp_path):
    json_path = tmp_path / "sim.json"
    # p of four digits, as --full's 4096 has (which takes 55 s of CPU to this one's 16 s)
    argv = [*COMMRT, "simulate", "--max-p", "1024", "--at-p", "256", "--samples", "10"]
    argv += ["--no-plots", "--json", json_path.name]
    rc, out = run_in_pty(argv, cwd=tmp_path)
    assert rc == 0, out[-3000:]
    lines = _fits(out)
    titles = ("time per all-reduce vs p", "synchronous step", "backup workers", "gossip step")
    for title in (*titles, "backup workers' control plane"):
        assert any(title in ln for ln in lines), title
    report = json.loads(json_path.read_text())
    assert report["p"][-1] == 1024 and "gossip (rotate)" in report["gossip"]["65536"]
    assert [r["p"] for r in report["control"]["rows"]] == [1 << k for k in range(2, 11)]


def test_simulate_where_the_pipelined_torus_wins_fits_80_columns():
    """At p=16 on the h100 preset the fastest above 64 MiB is
    torus2d_pipelined(2x8,s16,ring): the size table ran to 85 columns (new-user trial)."""
    argv = [*COMMRT, "simulate", "--max-p", "8", "--at-p", "16", "--samples", "10"]
    rc, out = run_in_pty([*argv, "--no-plots"])
    assert rc == 0, out[-3000:]
    lines = _fits(out)
    assert "# auto's choice: tp = torus2d_pipelined" in lines
    assert any(ln.startswith("   1 GiB") and ln.endswith("tp(2x8,s16,ring)") for ln in lines)


def test_the_launchers_tolerated_failure_lines_fit_80_columns():
    lines = tolerated_lines([0, 0, 0, -9], 1)
    assert lines[0] == "commrt: rank 3 was killed by SIGKILL; the other ranks carried on"
    assert "up to 1 of the 4 ranks" in lines[-1]
    wide = tolerated_lines([0] * 9999 + [-9, 255], 9999)
    assert len(wide) == 3 and all(len(ln) <= 80 for ln in lines + wide), wide


def test_the_default_bench_sweep_is_small():
    """The default sweep ran in 4.5 s (2 s of it starting the ranks) on 2 shared cores, 2 ranks
    over MPI, 6 algorithms, moving 70 MB in 168 calls per algorithm and timed run. The bound
    leaves room, not an order of magnitude: the old sweep (8 B..64 MiB, up to 1000 calls)
    moved 1.85 GB in 4504 calls and took 4 min 17 s."""
    sizes = bench.DEFAULT_SIZES
    calls = [bench.default_iterations(n) for n in sizes]
    assert sum(n * k for n, k in zip(sizes, calls)) < 80e6
    assert sum(calls) <= 200 and max(sizes) <= 16 << 20 and min(sizes) <= 8


def _commands(parser, path=()) -> list[tuple[str, ...]]:
    """Every command line that has a --help of its own: (), ("bench",), ("bench", "kernels")..."""
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(build_parser())


def test_every_command_with_a_help_is_checked():
    assert {("bench", "allreduce"), ("bench", "kernels"), ("trace", "merge")} <= set(COMMANDS)
    assert {("train",), ("simulate",), ("probe",), ()} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "commrt")
def test_every_help_fits_80_columns(command, monkeypatch, capsys):
    """At COLUMNS=80 bench allreduce's usage line ran to 89 columns, listing --dtype's
    choices, and bench kernels' to 86 with --wire's (new-user trial)."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as e:
        main([*command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: commrt {' '.join(command)}".rstrip())
    _fits(out)


SIMULATE_OPTIONS = [
    [],
    ["--network", "flat:12.5,100"],
    ["--ranks-per-node", "4", "--nics-per-node", "2", "--algorithms", "ring,hd,auto"],
    ["--sizes", "1K,64M", "--compute-ms", "250", "--delay-ms", "40", "--seed", "3"],
    ["--store-cost", "123.4,56.7,8.9", "--only", "control,backup"],
]


@pytest.mark.parametrize("extra", SIMULATE_OPTIONS, ids=lambda a: " ".join(a) or "defaults")
def test_simulate_speaks_one_unit_and_keeps_units_with_numbers(extra, capsys):
    """Every section, with every option: 80 columns, µs everywhere (not "us"), no wrapped
    header that leaves a number's unit for the next line, notes never inside a table."""
    import re

    argv = ["simulate", "--max-p", "64", "--at-p", "64", "--samples", "5", "--no-plots"]
    assert main([*argv, *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if len(ln) > 80] == []
    assert not [ln for ln in lines if re.search(r"\d us\b|\bus/", ln)], lines
    for prev, ln in zip(lines, lines[1:]):
        if ln.startswith("#  "):  # a wrapped title's continuation: never a bare unit first
            assert not re.match(r"#  (?:[kMGT]?B/s|µs|ms|s)\b", ln), (prev, ln)
            assert not re.search(r"\d$", prev), (prev, ln)
    tables = [i for i, ln in enumerate(lines) if ln and ln.split()[0].isdigit()]
    notes_inside = [
        lines[i] for i in range(min(tables), max(tables)) if lines[i].startswith("# simulating")
    ]
    for ln in notes_inside:  # a note comes after its table (a blank line or title before)
        assert lines[lines.index(ln) + 1].strip() == "" or lines[lines.index(ln) + 1][0] == "#"


def test_a_header_keeps_370_with_gb_per_second():
    from commrt.cli.simulate_sections import fit

    title = "# commrt simulate · network h100-nvlink-ndr: 8 ranks/node, intra α 3 µs, 370 GB/s"
    wrapped = fit(title + "; inter α 8 µs, 48 GB/s per NIC")
    assert "370 GB/s" in wrapped and all(len(ln) <= 80 for ln in wrapped.splitlines())


def test_a_slow_simulations_note_waits_for_the_end_of_its_table():
    from commrt.cli.simulate import _notes_after_tables

    said, held = [], []
    out = _notes_after_tables(said.append, held)
    out("\n## a table")
    out("   2  1 ms")
    held.append("# simulating ring at p=4096, 256 MiB took 1.2 s")  # mid-table
    out("   4  2 ms")
    out("\n# swept in 3.0 s")
    assert said == [
        "\n## a table",
        "   2  1 ms",
        "   4  2 ms",
        "# simulating ring at p=4096, 256 MiB took 1.2 s",
        "\n# swept in 3.0 s",
    ]


def test_commrt_warnings_print_within_80_columns_and_others_as_python_prints_them():
    from commrt.cli.commands import fit_warning
    from commrt.tuning.probe import ProbeWarning

    what = "probe: the tier inside a node measured slower than the one between nodes: " * 3
    text = fit_warning(ProbeWarning(what), ProbeWarning, "/a/long/path/probe_checks.py", 70)
    assert text.startswith("probe: the tier") and "/a/long/path" not in text
    _fits(text)
    other = fit_warning(RuntimeWarning("overflow"), RuntimeWarning, "/x/numpy.py", 3)
    assert other.startswith("/x/numpy.py:3: RuntimeWarning: overflow")


@pytest.mark.parametrize(
    "argv",
    [["train", "--algorithm", "gosip"], ["train", "--nproc", "0"], ["bench"]],
    ids=["unknown-algorithm", "bad-nproc", "no-subcommand"],
)
def test_a_careless_flags_error_fits_80_columns(argv, capsys):
    """argparse prints its error on one line; an unknown algorithm's list of the
    algorithms ran to 190 columns. Every line fits now, and the error is whole."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    _fits(err)
    said = " ".join(err.split("error: ", 1)[1].split())
    if argv[1:2] == ["--algorithm"]:
        assert "unknown algorithm 'gosip'" in said and "did you mean 'gossip'?" in said, err


def test_the_progress_bar_names_its_share_as_the_summary_does():
    from commrt.cli.train_output import step_line

    line = step_line(0, 8, 0.5, 1234.0, 0.22)
    assert line.endswith("samples/s exposed 22%") and " comm " not in line, line
