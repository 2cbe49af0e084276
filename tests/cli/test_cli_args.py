"""Careless arguments get one clear line from the parser (exit 2), never a traceback, a
hang or advice that fails next: stragglers, batches that do not split, --version, bare
subcommands, unknown algorithms, negative ranks; and what the summary and headers say.
All in this process, no ranks started."""

import argparse
import importlib.util
import pathlib
import types

import pytest
from helpers.cli import parse_error

import commrt
from commrt.cli import main
from commrt.cli.commands import build_parser, check_train
from commrt.cli.train_args import nearest_multiple

REPO = pathlib.Path(__file__).resolve().parents[2]


def _options(argv, capsys=None):
    args = build_parser().parse_args(argv)
    return check_train(args.parser, args)


# ------------------------------------------------------------------- 1. --straggler


@pytest.mark.parametrize(
    "spec,says",
    [
        ("1:inf", "SECONDS must be a finite number, got inf"),
        ("0:nan", "SECONDS must be a finite number, got nan"),
        ("exp:inf", "MEAN must be a finite number"),
        ("exp:1e9", "cannot finish within --timeout 300 s"),
        ("1:300", "cannot finish within --timeout 300 s"),
        ("foo", "unknown kind 'foo'"),
        ("lognormal:0.01:-1", "SIGMA (the spread) must be above 0, got -1"),
        ("lognormal:0.01:0", "SIGMA (the spread) must be above 0, got 0"),
        ("pareto:0.01:1", "shape must be above 1"),
        ("1:-0.5", "must be non-negative seconds"),
        ("exp:0.01:2", "use exp:MEAN"),
    ],
)
def test_straggler_mistakes_name_the_value_and_why(spec, says, capsys):
    line = parse_error(["train", "--straggler", spec], capsys)
    assert line.startswith("commrt train: error:") and "--straggler" in line
    assert says in line, line


def test_an_unknown_straggler_kind_lists_the_kinds(capsys):
    line = parse_error(["train", "--straggler", "foo"], capsys)
    assert "exp, pareto, lognormal" in line and "non-negative" not in line


def test_a_bad_sigma_does_not_blame_the_seconds(capsys):
    line = parse_error(["train", "--straggler", "lognormal:0.01:-1"], capsys)
    assert "SIGMA" in line and "seconds" not in line.split("SIGMA")[1]


def test_a_straggler_delay_is_measured_against_the_timeout_given(capsys):
    line = parse_error(["train", "--timeout", "10", "--straggler", "pareto:20"], capsys)
    assert "mean delay of 20 s" in line and "--timeout 10 s" in line
    assert _options(["train", "--timeout", "60", "--straggler", "pareto:20"]).straggler


def test_a_timeout_must_be_finite_and_positive(capsys):
    for bad in ("inf", "nan", "0", "-1"):
        assert "--timeout" in parse_error(["train", "--timeout", bad], capsys)


@pytest.mark.parametrize("command", [["train"], ["bench", "allreduce"], ["probe"]])
def test_a_timeout_past_the_longest_is_refused_before_the_launch(command, capsys):
    """--timeout 1e30 died in every rank of OverflowError (a timedelta), 1e12 of "timestamp
    out of range for platform time_t", and 1e10 in torch's store (new-user trial)."""
    for bad in ("1e30", "1e12", "1e10", "abc"):
        line = parse_error([*command, "--timeout", bad], capsys)
        assert "--timeout: give seconds above 0, at most 1e+08 (about 3 years)" in line, line
        assert line.endswith(f"got {bad}"), line
    assert build_parser().parse_args([*command, "--timeout", "1e8"]).timeout == 1e8


@pytest.mark.parametrize("flag", ["--lr", "--bucket-mb"])
def test_a_rate_or_size_must_be_a_finite_positive_number(flag, capsys):
    """--lr nan used to train on NaN to the end (found in a new-user trial)."""
    for bad in ("nan", "inf", "0", "-1", "x"):
        line = parse_error(["train", flag, bad], capsys)
        assert flag in line and ("finite number above 0" in line or "give a number" in line)


def test_a_bucket_cap_under_one_byte_is_a_parse_error(capsys):
    """--bucket-mb 1e-9 started the ranks, which all died of "bucket sizes must be
    positive" (its cap came to 0 bytes; found in a new-user trial)."""
    line = parse_error(["train", "--bucket-mb", "1e-9"], capsys)
    assert "--bucket-mb" in line and "less than one byte" in line and "9.5e-07" in line
    assert _options(["train", "--bucket-mb", "1e-6"]).bucket_mb == 1e-6


@pytest.mark.parametrize("flag", ["--compute-ms", "--delay-ms"])
def test_simulate_times_must_be_finite_and_not_negative(flag, capsys):
    """--compute-ms nan ended in the simulator's ValueError traceback (new-user trial)."""
    for bad in ("nan", "inf", "-5"):
        line = parse_error(["simulate", flag, bad], capsys)
        assert flag in line and "finite number of 0 or more" in line, line


@pytest.mark.parametrize(
    "spec, says",
    [
        ("flat:5,0", "gbytes_per_s must be positive"),
        ("flat:-1,5", "alpha_us must be non-negative"),
        ("pyproject.toml", "is not a network file (Expecting value"),
        ("{}", "is not a network file (a network file needs"),
    ],
)
def test_simulate_a_bad_network_is_one_line_not_a_traceback(spec, says, tmp_path):
    """--network flat:5,0 and a JSON file that is not a network ended in tracebacks."""
    if spec == "{}":
        spec = str(tmp_path / "empty.json")
        (tmp_path / "empty.json").write_text("{}")
    elif spec == "pyproject.toml":
        spec = str(REPO / spec)
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--max-p", "8", "--no-plots", "--network", spec])
    assert str(e.value).startswith(f"commrt simulate: --network {spec}") and says in str(e.value)


def test_trace_merge_of_a_file_that_is_not_a_trace_says_which(tmp_path, capsys):
    """commrt trace merge README.md ended in a JSONDecodeError traceback (new-user trial)."""
    good = tmp_path / "r0.json"
    good.write_text('{"traceEvents": []}')
    (tmp_path / "obj.json").write_text('{"a": 1}')
    out = tmp_path / "merged.json"
    for bad, says in ((REPO / "README.md", "not JSON"), (tmp_path / "obj.json", "traceEvents")):
        assert main(["trace", "merge", "-o", str(out), str(good), str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"{bad} is not a trace" in err and says in err, err
    assert not out.exists()  # nothing half-written


def test_trace_merge_of_a_folder_says_to_give_its_files(tmp_path, capsys):
    """commrt trace merge -o merged.json adir ended in an IsADirectoryError traceback."""
    folder = tmp_path / "adir"
    folder.mkdir()
    out = tmp_path / "merged.json"
    assert main(["trace", "merge", "-o", str(out), str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"commrt trace merge: {folder} is a folder, not a trace; give the trace files in it "
        f"(e.g. {folder}/*.json)"
    )
    assert not out.exists()


# ------------------------------------------------------ 2. batches that do not split


def test_nearest_multiple():
    assert [nearest_multiple(64, p) for p in (1, 2, 3, 5, 6, 7, 100)] == [
        64,
        64,
        63,
        65,
        66,
        63,
        100,
    ]


def test_a_default_batch_that_does_not_split_becomes_the_nearest_that_does(capsys):
    opts = _options(["train", "--nproc", "3"])
    assert opts.batch_schedule.batch_size(0) == 63
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "global batch 63 (21 per rank)" in out[0], out
    assert "--batch-size" in out[0] and len(out[0]) <= 80, out[0]


def test_the_gossip_advice_works_when_followed(capsys):
    line = parse_error(["train", "--nproc", "3", "--algorithm", "gossip"], capsys)
    assert "--gossip-topology dissemination" in line
    # ... and following it trains: the default batch adapts to 3 ranks
    opts = _options(
        ["train", "--nproc", "3", "--algorithm", "gossip", "--gossip-topology", "dissemination"]
    )
    assert opts.batch_schedule.batch_size(0) % 3 == 0


def test_the_gossip_error_advises_both_flags_when_both_are_needed(capsys):
    line = parse_error(
        ["train", "--nproc", "3", "--algorithm", "gossip", "--batch-size", "64"], capsys
    )
    assert "--gossip-topology dissemination" in line and "--batch-size 63" in line


@pytest.mark.parametrize(
    "argv,advice",
    [
        (["--nproc", "3", "--batch-size", "64"], "--batch-size 63"),
        (["--nproc", "5", "--batch-size", "64"], "--batch-size 65"),
        (["--nproc", "3", "--batch-schedule", "0:32,3:64"], "--batch-schedule 0:33,3:63"),
    ],
)
def test_a_batch_the_user_gave_that_does_not_split_gets_one_that_does(argv, advice, capsys):
    line = parse_error(["train", *argv], capsys)
    assert advice in line, line
    # and the advice passes
    fixed = argv[:2] + advice.split()
    assert _options(["train", *fixed]).batch_schedule is not None


# -------------------------------------------------- 3. --version, bare subcommands


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"commrt {commrt.__version__}" == "commrt 0.1.0"


@pytest.mark.parametrize("command,names", [("bench", "allreduce, kernels"), ("trace", "merge")])
def test_a_bare_command_names_its_subcommands_and_shows_its_usage(command, names, capsys):
    with pytest.raises(SystemExit) as e:
        main([command])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: commrt {command}" in err and f"commrt {command}: error:" in err
    assert names in err and "arguments are required" not in err, err


def test_bare_commrt_names_the_commands(capsys):
    line = parse_error([], capsys)
    assert all(c in line for c in ("bench", "train", "trace", "simulate")), line


# ------------------------------------------------------------ 4. --algorithm foo


def test_an_unknown_algorithm_lists_what_the_flag_takes(capsys):
    from commrt.algorithms import NAMES

    line = parse_error(["train", "--algorithm", "foo"], capsys)
    assert "unknown algorithm 'foo'" in line and "--algorithm" in line
    assert all(n in line for n in (*NAMES, "gossip", "backup")), line
    assert "instance" not in line and "commrt.algorithms" not in line


def test_bench_algorithms_lists_only_all_reduces(capsys):
    line = parse_error(["bench", "allreduce", "--algorithms", "nope"], capsys)
    assert "ring" in line and "torus2d" in line and "gossip" not in line


# ---------------------------------------------------------------- 5. --kill -1:5


@pytest.mark.parametrize("argv", [["--kill", "-1:5"], ["--kill=-1:5"]])
def test_a_negative_kill_rank_gets_the_range_message(argv, capsys):
    line = parse_error(["train", *argv], capsys)
    assert "--kill -1:5: the rank must be in 0..1" in line
    assert "expected one argument" not in line


@pytest.mark.parametrize(
    "argv", [["bench", "allreduce"], ["bench", "kernels"], ["simulate"], ["probe"]]
)
def test_a_negative_size_gets_the_size_message(argv, capsys):
    line = parse_error([*argv, "--sizes", "-4K"], capsys)
    assert "bad size '-4K'" in line and "expected one argument" not in line


def test_a_negative_straggler_rank_gets_the_range_message(capsys):
    assert "outside 0..1" in parse_error(["train", "--straggler", "-1:0.5"], capsys)


def test_a_good_kill_still_parses():
    assert _options(["train", "--kill", "1:5"]).kill == (1, 5)


# ------------------------------------------------------- 6. one rank, in-process


def test_one_rank_says_it_ran_in_this_process():
    from commrt.cli.train_output import _ranks_row

    one = types.SimpleNamespace(world_size=1, backend=types.SimpleNamespace(value="mpi"))
    two = types.SimpleNamespace(world_size=2, backend=types.SimpleNamespace(value="gloo"))
    assert "in this process" in _ranks_row(one) and "mpi" not in _ranks_row(one)
    assert _ranks_row(two) == "2 × gloo"


# -------------------------------------------------------- 7. headers and tables


def test_the_schedule_header_says_each_name_once():
    from commrt.algorithms import Gossip, Ring

    assert Gossip().schedule(4).table().splitlines()[0].startswith("gossip · 4 ranks")
    assert Ring().schedule(4).table().splitlines()[0].startswith("ring all_reduce · 4 ranks")


def test_the_kernel_bench_summary_keeps_names_apart(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # bench_kernels imports cuda_timing
    spec = importlib.util.spec_from_file_location(
        "bench_kernels_for_test", REPO / "bench" / "bench_kernels.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    head = ["device", "layout", "size", *mod.OPS]
    assert mod.summary_line(head).split() == head


# ------------------------------------------------------------- output files and folders


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--trace", "{bad}"],
        ["probe", "--save", "{bad}"],
        ["bench", "allreduce", "--json", "{bad}"],
        ["bench", "allreduce", "--csv", "{bad}"],
        ["bench", "kernels", "--plot", "{bad}.png"],
        ["simulate", "--json", "{bad}"],
        ["simulate", "--out-dir", "{bad}/plots"],
        ["trace", "merge", "-o", "{bad}", "in.json"],
    ],
)
def test_an_output_nobody_can_write_is_refused_before_the_work(argv, tmp_path, capsys):
    # a file where a folder should be: the write at the end of a long run would fail
    (tmp_path / "a-file").write_text("")
    bad = str(tmp_path / "a-file" / "out.json")
    line = parse_error([a.replace("{bad}", bad) for a in argv], capsys)
    assert f"cannot write {bad}" in line and "a file is in the way of the folder" in line


def test_an_output_file_gets_its_folders_and_a_folder_is_no_file(tmp_path, capsys):
    from commrt.cli.units import output_file

    deep = tmp_path / "new" / "deeper" / "m.json"
    assert output_file(str(deep)) == str(deep) and deep.parent.is_dir()
    line = parse_error(["trace", "merge", "-o", str(tmp_path), "in.json"], capsys)
    assert f"{tmp_path} is a folder; give a file name" in line


# ------------------------------------------ plot formats, devices, type names, shapes


@pytest.mark.parametrize("command", [["bench", "allreduce"], ["bench", "kernels"]])
def test_a_plot_format_matplotlib_cannot_write_is_refused_before_the_work(
    command, tmp_path, capsys
):
    """--plot out/x.txt ran the whole benchmark, then failed in matplotlib's savefig
    ("Format 'txt' is not supported"; new-user trial)."""
    for name, says in (
        ("x.txt", "matplotlib cannot write .txt files"),
        ("x", "no extension to tell the format"),
    ):
        path = tmp_path / "new" / name
        line = parse_error([*command, "--plot", str(path)], capsys)
        assert f"--plot: cannot plot to {path}: {says}; give one of " in line, line
        assert ".pdf" in line and ".png" in line and ".svg" in line
        assert not path.parent.exists()  # refused before any folder was made
    for good in ("x.png", "x.PDF", "x.svg"):
        path = str(tmp_path / good)
        assert build_parser().parse_args([*command, "--plot", path]).plot == path


def test_bench_kernels_takes_only_a_device_it_can_run_on(capsys):
    """--device tpu ended in torch's RuntimeError traceback (new-user trial)."""
    line = parse_error(["bench", "kernels", "--device", "tpu"], capsys)
    assert line.endswith("argument --device: give cpu or cuda (or cuda:N), got 'tpu'"), line
    for good in ("cpu", "cuda", "cuda:1"):
        assert build_parser().parse_args(["bench", "kernels", "--device", good]).device == good


def _type_functions(parser) -> dict[str, object]:
    """Every flag's argparse type in ``parser`` and its subcommands: "command --flag" -> type."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.update(_type_functions(sub))
        elif callable(action.type):
            found[f"{parser.prog} {(action.option_strings or [action.dest])[0]}"] = action.type
    return found


def test_no_type_function_leaks_its_python_name():
    """argparse names a type in "invalid NAME value" from its __name__: the parser said
    "invalid positive_int value: 'abc'" and "invalid _pow2 value: 'abc'" (new-user trial)."""
    types_ = _type_functions(build_parser())
    assert len(types_) > 20
    leaks = {flag: t.__name__ for flag, t in types_.items() if "_" in t.__name__}
    assert not leaks, leaks


@pytest.mark.parametrize(
    "argv",
    [["train", "--nproc", "abc"], ["train", "--epochs", "1.5"], ["simulate", "--max-p", "abc"]],
)
def test_a_whole_number_flag_says_it_wants_one(argv, capsys):
    line = parse_error(argv, capsys)
    assert line.endswith(f"{argv[-2]}: give a whole number, got {argv[-1]!r}"), line
    assert "positive_int" not in line and "_pow2" not in line


@pytest.mark.parametrize("shape", ["abc", "2x", "2x2x2", "0x4", "-1x2"])
def test_a_torus_shape_that_is_not_one_says_what_a_shape_is(shape, capsys):
    """--torus-shape abc said "invalid literal for int() with base 10: 'abc'"."""
    line = parse_error(["train", "--algorithm", "torus2d", "--torus-shape", shape], capsys)
    assert "--torus-shape: give ROWSxCOLS, like 2x2" in line and f"got {shape!r}" in line, line
    assert "int()" not in line and "unpack" not in line
    assert _options(["train", "--algorithm", "torus2d", "--torus-shape", "1x2"]).algorithm.cols == 2
