"""``commrt train --help`` is complete, misspelt flags get a suggestion, dtype names are
taken long and short alike, and the torus-shape error speaks in flags. In this process,
no ranks started."""

import argparse

import pytest
import torch
from helpers.cli import parse_error

from commrt.cli import main
from commrt.cli.commands import build_parser, check_train


def _train_parser() -> argparse.ArgumentParser:
    return build_parser().parse_args(["train"]).parser


def test_train_help_has_a_description_and_every_flag_its_help_and_default(capsys):
    parser = _train_parser()
    assert parser.description and "digits" in parser.description
    for action in parser._actions:
        if action.dest == "help":
            continue
        flag = action.option_strings[0]
        assert action.help, f"{flag} has no help"
        if action.default not in (None, False):
            assert "default" in action.help, f"{flag}'s help does not give its default"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out.split("\noptions:", 1)[1]
    for flag, default in [("--epochs", "8"), ("--lr", "0.05"), ("--seed", "0")]:
        said = out.split(flag, 1)[1].split("\n  --", 1)[0]
        assert f"default {default})" in " ".join(said.split()), (flag, said)


@pytest.mark.parametrize(
    "argv, suggestion",
    [
        (["train", "--algoritm", "ring"], "did you mean --algorithm?"),
        (["train", "--epoch", "3", "--sed", "1"], "--sed: did you mean --seed?"),
        (["bench", "allreduce", "--dtpye", "bf16"], "did you mean --dtype?"),
    ],
)
def test_a_misspelt_flag_gets_a_suggestion_and_the_subcommand_usage(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    said = " ".join(err.split())  # the error is wrapped at 80 columns
    assert f"usage: commrt {argv[0]}" in err and suggestion in said, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, suggestion",
    [
        (["train", "--backend", "shmm"], "did you mean 'shm'?"),
        (["trian"], "did you mean 'train'?"),
        (["bench", "allreduse"], "did you mean 'allreduce'?"),
    ],
)
def test_a_misspelt_choice_or_command_gets_a_suggestion(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    said = " ".join(capsys.readouterr().err.split())  # wrapped at 80 columns
    assert "invalid choice" in said and suggestion in said, said


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("bf16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp32", torch.float32),
    ],
)
def test_comm_dtype_takes_long_and_short_names(name, dtype):
    # the launcher imports no torch: the options carry torch's name for the dtype
    args = build_parser().parse_args(["train", "--comm-dtype", name])
    assert getattr(torch, check_train(args.parser, args).comm_dtype) is dtype


def test_bench_dtype_takes_bfloat16_and_bf16():
    for name in ("bf16", "bfloat16"):
        assert build_parser().parse_args(["bench", "allreduce", "--dtype", name]).dtype == name


def test_the_torus_shape_error_speaks_in_flags(capsys):
    line = parse_error(["train", "--algorithm", "torus2d", "--torus-shape", "3x3"], capsys)
    assert "--torus-shape 3x3 has 9 ranks but --nproc is 2" in line
    assert "1x2, 2x1" in line and "None" not in line and "rows/cols" not in line


def _options(parser, path=()):
    """(command, option, action) of every option of ``parser`` and its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings:
            yield " ".join(path), action.option_strings[-1], action


def test_every_option_with_a_default_shows_it_in_its_help():
    """``--repeats`` had a default of 3 that --help never said."""
    from commrt.cli.commands import build_parser

    hidden = []
    for command, flag, action in _options(build_parser()):
        if action.default in (None, False, argparse.SUPPRESS) or action.help in (
            None,
            argparse.SUPPRESS,
        ):
            continue
        if "%(default)" not in action.help and "default" not in action.help:
            hidden.append(f"commrt {command} {flag} (default {action.default!r})")
    assert not hidden, hidden
