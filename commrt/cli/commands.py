"""The ``commrt`` command line: one parser, the backend, and starting the ranks.

Each command declares its flags beside its code (a ``register(sub)`` each):

* ``commrt train`` (:mod:`commrt.cli.train_args`, :mod:`commrt.cli.train`):
  data-parallel training on the digits dataset, with a progress bar and a
  summary table;
* ``commrt bench allreduce`` and ``commrt bench kernels``
  (:mod:`commrt.cli.bench_command`): all-reduce per algorithm next to the
  engine's own (nccl-tests style table, optional PNG); pack/unpack GB/s;
* ``commrt trace merge`` (:mod:`commrt.cli.traces`): one timeline from
  per-rank traces;
* ``commrt simulate`` (:mod:`commrt.cli.simulate`): all-reduce at thousands
  of ranks under an α-β model;
* ``commrt probe`` (:mod:`commrt.cli.probe`): this job's α and β as ``auto``
  measures them, saved for reuse;
* ``commrt diagnose`` (:mod:`commrt.cli.diagnose`): a stalled job's verdict
  again, from its ``COMMRT_DUMP`` files.

This module adds them to one parser, checks what several share, and with
``--nproc N`` the multi-rank commands start N local ranks (mpiexec for mpi,
subprocesses for gloo); under mpiexec or torchrun they run as one of the
ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import textwrap
import time
import warnings
from typing import Sequence

from commrt import __version__
from commrt.cli import bench_command, extras, output
from commrt.cli import launch as launcher
from commrt.cli.flags import unknown_flags
from commrt.cli.startup import launcher_line, rank_startup
from commrt.cli.train_args import algorithm_choices, check_train, unknown_algorithm
from commrt.cli.units import cuda_available
from commrt.errors import did_you_mean
from commrt.runtime.choice import LOCAL, ONLY_GLOO_SURVIVES, Backend, Situation, choose

__all__ = ["main", "build_parser", "check_train"]


def auto_backend(nproc: int, ranks_may_die: bool = False, who: str = "") -> str:
    """What ``--backend auto`` runs on: the first transport of auto's one order
    (:func:`commrt.runtime.choice.choose`) for the ``nproc`` ranks this command starts on
    this host, saying why where it passes a better one over (``who``: what makes ranks
    that may die, and its verb: "backup workers run"). Ranks that mpiexec or torchrun
    started get ``auto`` itself: ``commrt.init`` chooses, every rank together."""
    if launcher.already_launched() and not ranks_may_die:
        return "auto"
    device = "cuda" if cuda_available() else "cpu"
    s = Situation.here(device, LOCAL, nproc, nproc, _mpi_installed(), ranks_may_die)
    from commrt.transports.shm_connect import unusable  # imports torch: not for --help

    s = dataclasses.replace(s, shm_unusable=unusable())  # every rank will be here
    chosen = choose(s)[0]
    if device == "cuda" and s.nccl_missing is not None:
        why = s.nccl_missing.removeprefix("commrt: ")
        print(f"--backend auto runs {chosen}, not nccl:\n  {why}", flush=True)
    best = choose(dataclasses.replace(s, ranks_may_die=False))[0]
    if chosen is not best:
        print(f"{who} over {chosen}, not {best}: {ONLY_GLOO_SURVIVES}", flush=True)
    return str(chosen)


def _mpi_installed() -> bool:
    """Whether this command can start its ranks with mpiexec (mpi4py and mpiexec exist)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return launcher.mpiexec_path() is not None


#: why backup workers (``commrt train --algorithm backup``) do not run over MPI
MPI_KILLS_ALL = "MPI ends every rank when one dies"


def check_backend(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    *,
    survives: bool = False,
    kill: bool = False,
    who: str = "backup workers run",
) -> str:
    """The backend to run on. ``survives``: the job must carry on past a dead rank (``who``
    names what asks for it, and its verb: "backup workers run"), so auto picks gloo
    (:data:`commrt.runtime.choice.ONLY_GLOO_SURVIVES`); ``kill``: --kill will kill one.
    The mpich wheel ends the whole job when one rank dies, whatever the flags, so mpi with
    --kill is refused."""
    backend = args.backend
    if backend == "auto":
        return auto_backend(args.nproc, survives, who)
    traits = Backend(backend)
    if traits.one_death_ends_all and survives and kill:
        parser.error(
            f"--kill with --backend mpi: {MPI_KILLS_ALL}, so the whole job would end; "
            f"pass --backend gloo (or leave --backend out) to carry on past a dead rank"
        )
    if traits.moves_cuda and not cuda_available():
        parser.error(
            f"--backend {backend} needs a CUDA GPU and none is available here; use --backend "
            "shm (the ranks on this host, through shared memory), gloo or mpi, or leave "
            "--backend out"
        )
    if traits.started_by_mpiexec:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            parser.error(
                "--backend mpi needs mpi4py: pip install 'commrt[mpi]', or use --backend gloo"
            )
        if not launcher.already_launched() and launcher.mpiexec_path() is None:
            parser.error(
                "--backend mpi needs mpiexec on PATH (pip install mpich), or use --backend gloo"
            )
    return backend


class Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors wrapped at 80 columns like every other line the
    CLI prints (argparse prints the message on one line, however long; an unknown
    algorithm's list of choices ran to 190). Subcommands' parsers are made of this
    class too (``add_subparsers`` makes its parsers of its parent's class)."""

    def error(self, message: str):
        message += _choice_hint(message)
        head = f"{self.prog}: error: "
        lines = textwrap.wrap(
            head + message,
            80,
            subsequent_indent="  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        super().error("\n".join(lines)[len(head) :])


#: argparse's refusal of a value outside ``choices`` (a flag's, or the command's name);
#: the choices are quoted up to Python 3.12.7, bare from 3.12.8
INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def _choice_hint(message: str) -> str:
    """``; did you mean 'shm'?`` for an invalid choice close to one of its choices
    (argparse names the choices but not the nearest; Python 3.14 would, so a message that
    already suggests one is left as it is)."""
    m = INVALID_CHOICE.search(message)
    if m is None or "you meant" in message or "did you mean" in message:
        return ""
    choices = [c.strip().strip("'") for c in m.group(2).split(",")]
    return did_you_mean(m.group(1), choices)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="commrt",
        description="commrt: data-parallel training, benchmarks and simulation of its "
        "communication runtime. Run 'commrt COMMAND --help' for a command's flags.",
    )
    parser.add_argument("--version", action="version", version=f"commrt {__version__}")
    # not required=True: argparse would then say "arguments are required: command"; main
    # names the commands instead
    sub = parser.add_subparsers(dest="command")
    from commrt.cli import bench_command, diagnose, probe, simulate, traces, train_args

    for command in (bench_command, train_args, traces, simulate, probe, diagnose):
        command.register(sub)
    # every field main reads, so that it never asks whether one exists: a subcommand's own
    # defaults (its parser, its run, its flags') replace these
    parser.set_defaults(
        parser=parser,
        subcommands=tuple(sub.choices),
        run=None,
        what=None,
        plot=None,
        algorithms=None,
        single_process=False,
        timeout=None,
        mpi_anchor=False,
    )
    return parser


def _relaunch_or_run(args, argv: Sequence[str], parser, options=None) -> int:
    """Start the ranks, or be one of them (``options``: commrt train's checked options)."""
    backups = options is not None and options.algorithm.family == "backup"
    may_die = options.ranks_may_die(args.nproc) if options is not None else 0
    kill = options is not None and options.kill is not None
    restarts = options.max_restarts if options is not None else 0
    # must run where a rank may die (and, with restarts, a replacement rejoin)
    survives = backups or (may_die > 0 and kill) or restarts > 0
    who = "backup workers run" if backups else "gossip with a deadline runs"
    who = who if backups or not restarts else "a job with --max-restarts runs"
    backend = check_backend(parser, args, survives=survives, kill=kill, who=who)
    if restarts and not Backend(backend).takes_a_replacement:
        parser.error(
            f"--max-restarts with --backend {backend}: only gloo lets a replacement rejoin "
            f"a running job ({MPI_KILLS_ALL}; NCCL cannot add a rank either); pass "
            "--backend gloo (or leave --backend out)"
        )
    if args.nproc > 1 and not launcher.already_launched():
        child = list(argv) + ["--backend", backend]
        # the ranks take seconds to import torch and meet: say so at once
        print(launcher_line(args.nproc, backend), flush=True)
        # backup workers: the launcher hosts the control store (so any worker may die) and
        # lets up to b workers die without stopping the others
        code = launcher.launch(
            child,
            args.nproc,
            use_mpiexec=Backend(backend).started_by_mpiexec
            or (args.mpi_anchor and bench_command.mpi_anchor(Backend(backend))),
            host_store=backups or may_die > 0,
            tolerate=may_die,
            restarts=restarts,
            # a backup worker the others left behind gets as long as any wait may take
            linger_s=args.timeout,
        )
        if code == 0 and options is not None:  # the summary's times end before shut-down
            took = time.time() - launcher.launched_at()
            print(f"commrt train: done {took:.2f} s after the launch (shut-down included)")
        return code
    if options is not None:
        return args.run(dataclasses.replace(options, backend=backend))
    return args.run(argparse.Namespace(**{**vars(args), "backend": backend}))


#: flags whose values may start with "-" (a rank, a size): argparse would take "-1:5" or
#: "-4K" for a flag
_SIGNED_VALUES = ("--kill", "--straggler", "--sizes", "--torus-shape")


def _negative_values(argv: list[str]) -> list[str]:
    """``--kill -1:5`` as ``--kill=-1:5``, so that the value reaches its check (which then
    names the bad rank or size) instead of argparse's "expected one argument"."""
    out: list[str] = []
    for a in argv:
        if out and out[-1] in _SIGNED_VALUES and a[:1] == "-" and a[1:2].isdigit():
            out[-1] = f"{out[-1]}={a}"
        else:
            out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The ``commrt`` command; a Ctrl-C ends it with status 130 and one line, not a
    traceback per rank (:func:`commrt.cli.launch.interrupted`); a reader that leaves
    (``commrt simulate | head``) ends it quietly (:mod:`commrt.cli.output`)."""
    warnings.formatwarning = fit_warning
    with output.guarding_stdout():
        try:
            return _main(argv)
        except KeyboardInterrupt:
            return launcher.interrupted()


_PYTHON_FORMAT = warnings.formatwarning


def fit_warning(message, category, filename, lineno, line=None) -> str:
    """How a warning prints in a ``commrt`` process: commrt's own (a probe that measured
    something inconsistent, say) as its message wrapped to 80 columns, since Python's
    line (the file's path, the class, the source line) runs past the tables around it;
    other packages' warnings as Python prints them."""
    if not category.__module__.startswith("commrt."):
        return _PYTHON_FORMAT(message, category, filename, lineno, line)
    return "\n".join(textwrap.wrap(str(message), 80, subsequent_indent="  ")) + "\n"


def _main(argv: Sequence[str] | None) -> int:
    argv = _negative_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # errors after parsing belong to the subcommand: "commrt train: error: ..." with its usage
    sub = args.parser
    if unknown:  # a misspelt flag: the subcommand's usage and the flag it may have meant
        sub.error(unknown_flags(sub, unknown))
    if args.run is None:  # "commrt", "commrt bench": which one?
        sub.error(f"choose one of: {', '.join(args.subcommands)} (then --help for its flags)")
    extras.check(args)  # scikit-learn, matplotlib: one line and status 2 if one is missing
    # a rank of commrt train: its start-up's phases from here (checking the flags imports torch)
    rank = args.command == "train" and launcher.already_launched()
    startup = rank_startup(launcher.launched_at()) if rank else None
    options = check_train(sub, args) if args.command == "train" else None
    if startup is not None:
        options = dataclasses.replace(options, startup=startup)
    if args.algorithms:
        _check_algorithms(sub, args.algorithms)
    if args.single_process:
        return args.run(args)
    return _relaunch_or_run(args, argv, sub, options)


def _check_algorithms(parser: argparse.ArgumentParser, text: str) -> None:
    """``--algorithms`` (bench allreduce, simulate): every name an all-reduce."""
    from commrt.algorithms import resolve
    from commrt.schedule import Collective

    for a in text.split(","):
        try:
            alg = resolve(a)
        except ValueError:
            names = tuple(
                n for n in algorithm_choices() if resolve(n).supports(Collective.ALL_REDUCE)
            )
            parser.error(unknown_algorithm(a, names, "--algorithms"))
        if not alg.supports(Collective.ALL_REDUCE):
            parser.error(
                f"{a} is not an all-reduce (commrt simulate models gossip in a section of its own)"
            )
