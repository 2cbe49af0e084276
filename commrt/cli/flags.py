"""Flags several ``commrt`` commands share, declared once.

* :func:`rank_flags`: ``--nproc``, ``--backend``, ``--timeout``, for the
  commands that run on every rank (train, bench allreduce, probe);
* :func:`file_flags`: ``--csv`` and ``--json``, a table's full detail;
* :func:`plot_flag`: ``--plot FILE``;
* :func:`dtype_flag`: an element-type flag with its choices in the help.
"""

from __future__ import annotations

import argparse
import difflib

from commrt.cli.units import (
    DTYPE_NAMES,
    DTYPES,
    output_file,
    plot_file,
    positive_int,
    timeout_seconds,
)
from commrt.process.rendezvous import DEFAULT_TIMEOUT_S
from commrt.runtime.choice import Backend, describe


def rank_flags(p: argparse.ArgumentParser) -> None:
    """How a multi-rank command starts its ranks, over what, and how long a wait may take."""
    p.add_argument(
        "--nproc", type=positive_int, default=2, help="ranks to start on this host (default 2)"
    )
    p.add_argument(
        "--backend",
        choices=["auto", *(str(b) for b in Backend)],
        default="auto",
        help=f"{describe()} (default auto)",
    )
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds any wait may take (default {DEFAULT_TIMEOUT_S:g}, at most 1e8)",
    )


def file_flags(p: argparse.ArgumentParser, what: str) -> None:
    """--csv and --json: the table's full detail (the table keeps to 80 columns)."""
    p.add_argument("--csv", metavar="PATH", type=output_file, help=f"also write {what} as CSV")
    p.add_argument("--json", metavar="PATH", type=output_file, help=f"also write {what} as JSON")


def plot_flag(p: argparse.ArgumentParser, what: str) -> None:
    """--plot, in any format matplotlib writes (checked before the work starts)."""
    p.add_argument(
        "--plot", metavar="FILE", type=plot_file, help=f"also plot {what} to FILE (.png, .svg…)"
    )


def dtype_flag(p: argparse.ArgumentParser, flag: str, what: str) -> None:
    """A dtype flag; its choices listed in the help (in the usage line they ran past 80
    columns)."""
    p.add_argument(
        flag,
        choices=sorted(DTYPES),
        default="float32",
        metavar="DTYPE",
        help=f"{what}: {DTYPE_NAMES} (default float32)",
    )


def unknown_flags(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """The error for arguments ``parser`` does not take, with the nearest flag each
    misspelt one may have meant (argparse alone prints the top-level usage and no hint)."""
    flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
    hints = []
    for arg in unknown:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, flags, n=1) if name.startswith("-") else []
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    return (
        f"unrecognized arguments: {' '.join(unknown)}" + ("; " if hints else "") + "; ".join(hints)
    )
