"""The ``commrt`` command line.

* ``commrt train``: data-parallel training on the digits dataset, with a
  progress bar and a summary table;
* ``commrt bench allreduce``: all-reduce per algorithm next to the engine's
  own (nccl-tests style table, optional PNG); ``commrt bench kernels``:
  pack/unpack GB/s;
* ``commrt trace merge``: one timeline from per-rank traces;
* ``commrt simulate``: all-reduce at thousands of ranks under an α-β model;
* ``commrt probe``: this job's α and β as ``auto`` measures them, saved for reuse.

With ``--nproc N`` the multi-rank commands start N local ranks themselves
(mpiexec for mpi, subprocesses for gloo); under mpiexec or torchrun they
run as one of the ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Sequence

import torch

from commrt import __version__
from commrt.cli import launch as launcher
from commrt.cli.train_args import algorithm_choices, check_train, unknown_algorithm
from commrt.cli.units import (
    DTYPE_NAMES,
    DTYPES,
    bucket_mb,
    grid_shape,
    kernel_device,
    output_file,
    plot_file,
    positive_int,
    positive_number,
    size_list,
    timeout_seconds,
)

__all__ = ["main", "build_parser", "check_train", "DTYPES"]


def default_backend() -> str:
    """auto on the command line: nccl with a GPU, mpi when mpi4py and mpiexec exist, else gloo."""
    if torch.cuda.is_available():
        return "nccl"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "gloo"
    return "mpi" if launcher.mpiexec_path() else "gloo"


#: why backup workers (``commrt train --algorithm backup``) do not run over MPI
MPI_KILLS_ALL = "MPI ends every rank when one dies"


def check_backend(
    parser: argparse.ArgumentParser, backend: str, *, backups: bool = False, kill: bool = False
) -> str:
    """The backend to run on. ``backups``: train with backup workers, which must survive a
    dead rank; ``kill``: --kill will kill one. The mpich wheel ends the whole job when one
    rank dies, whatever the flags, so auto picks gloo for them, and mpi with --kill is
    refused."""
    if backend == "auto":
        chosen = default_backend()
        if backups and chosen == "mpi":
            print(f"backup workers run over gloo: {MPI_KILLS_ALL}", flush=True)
            return "gloo"
        return chosen
    if backend == "mpi" and backups and kill:
        parser.error(
            f"--kill with --backend mpi: {MPI_KILLS_ALL}, so the whole job would end; "
            f"pass --backend gloo (or leave --backend out) for backup workers that carry on"
        )
    if backend == "nccl" and not torch.cuda.is_available():
        parser.error(
            "--backend nccl needs a CUDA GPU and none is available here; use --backend mpi or gloo"
        )
    if backend == "mpi":
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


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nproc", type=positive_int, default=2, help="ranks to start on this host (default 2)"
    )
    p.add_argument(
        "--backend",
        choices=["auto", "mpi", "gloo", "nccl"],
        default="auto",
        help="auto: nccl with a GPU, else mpi if installed, else gloo",
    )
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=300.0,
        help="seconds any wait may take (default 300, at most 1e8)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commrt",
        description="commrt: data-parallel training, benchmarks and simulation of its "
        "communication runtime. Run 'commrt COMMAND --help' for a command's flags.",
    )
    parser.add_argument("--version", action="version", version=f"commrt {__version__}")
    # not required=True: argparse would then say "arguments are required: command"; main
    # names the commands instead
    sub = parser.add_subparsers(dest="command")
    _add_bench(sub)
    _add_train(sub)
    _add_trace(sub)
    from commrt.cli import probe, simulate

    simulate.register(sub)
    probe.register(sub, _common)
    parser.set_defaults(parser=parser, subcommands=tuple(sub.choices))
    return parser


def _add_files(p, what: str) -> None:
    """--csv and --json: the table's full detail (the table keeps to 80 columns)."""
    p.add_argument("--csv", metavar="PATH", type=output_file, help=f"also write {what} as CSV")
    p.add_argument("--json", metavar="PATH", type=output_file, help=f"also write {what} as JSON")


def _add_plot(p, what: str) -> None:
    """--plot, in any format matplotlib writes (checked before the work starts)."""
    p.add_argument(
        "--plot", metavar="FILE", type=plot_file, help=f"also plot {what} to FILE (.png, .svg…)"
    )


def _add_dtype(p, flag: str, what: str) -> None:
    """A dtype flag; its choices listed in the help (in the usage line they ran past 80
    columns)."""
    p.add_argument(
        flag,
        choices=sorted(DTYPES),
        default="float32",
        metavar="DTYPE",
        help=f"{what}: {DTYPE_NAMES} (default float32)",
    )


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="measure collectives")
    bsub = bench.add_subparsers(dest="what")
    ar = bsub.add_parser("allreduce", help="all-reduce: commrt algorithms vs the native engine")
    _common(ar)
    ar.add_argument(
        "--algorithms",
        default="auto,ring,halving_doubling,recursive_doubling,torus2d",
        help="comma-separated algorithm names "
        "(default auto,ring,halving_doubling,recursive_doubling,torus2d)",
    )
    ar.add_argument(
        "--sizes",
        type=size_list,
        default=None,
        help="comma-separated sizes (default 8,4K,64K,1M,16M: seconds)",
    )
    _add_dtype(ar, "--dtype", "element type")
    ar.add_argument("--repeats", type=positive_int, default=3, help="timed runs per point (median)")
    ar.add_argument(
        "--iters",
        type=positive_int,
        default=None,
        help="calls per timed run (default: from the size, 3..50, ~16 MB moved per run)",
    )
    _add_plot(ar, "busbw vs size")
    _add_files(ar, "every point with its element count")
    ar.set_defaults(run=cmd_bench_allreduce, parser=ar)
    kb = bsub.add_parser(
        "kernels", help="pack/unpack GB/s vs a plain copy and cat+scale (one process)"
    )
    kb.add_argument(
        "--sizes", type=size_list, default=None, help="bucket sizes (default 1M,4M,16M,64M,100M)"
    )
    _add_dtype(kb, "--wire", "bucket (wire) dtype")
    kb.add_argument("--device", type=kernel_device, help="cpu or cuda (default: cuda if available)")
    _add_plot(kb, "GB/s vs size")
    _add_files(kb, "every point with its element count, bytes moved and time")
    kb.set_defaults(run=cmd_bench_kernels, single_process=True, parser=kb)
    bench.set_defaults(parser=bench, subcommands=tuple(bsub.choices))


def _add_train(sub) -> None:
    tr = sub.add_parser(
        "train", help="data-parallel training of an MLP on the digits dataset (CPU by default)"
    )
    _common(tr)
    tr.add_argument(
        "--algorithm",
        default="ring",
        help="ring, halving_doubling, torus2d, auto, gossip, or backup (backup "
        "workers, see --backups; default ring)",
    )
    tr.add_argument(
        "--gossip-topology",
        choices=["hypercube", "dissemination"],
        default=None,
        help="for --algorithm gossip (default hypercube; dissemination handles any --nproc)",
    )
    tr.add_argument(
        "--gossip-async",
        action="store_true",
        help="for --algorithm gossip: apply each step's mix one step later, overlapped",
    )
    tr.add_argument(
        "--torus-shape",
        metavar="ROWSxCOLS",
        type=grid_shape,
        help="grid for --algorithm torus2d, e.g. 2x2",
    )
    tr.add_argument("--epochs", type=positive_int, default=8)
    tr.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="global batch, all ranks together (default 64, or the nearest that splits "
        "over --nproc)",
    )
    tr.add_argument(
        "--batch-schedule",
        metavar="EPOCH:BATCH,...",
        help="grow the global batch at epochs, e.g. 0:32,3:64,6:128 (lr scales linearly)",
    )
    tr.add_argument(
        "--label-smoothing",
        type=float,
        default=0.1,
        help="for torch.nn.CrossEntropyLoss (default 0.1, as in Mikami et al.)",
    )
    tr.add_argument(
        "--comm-dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="wire dtype"
    )
    tr.add_argument(
        "--backups",
        type=int,
        default=None,
        metavar="B",
        help="with --algorithm backup: drop the last B of N+B gradients each step (default 1)",
    )
    _add_faults(tr)
    tr.add_argument(
        "--trace",
        metavar="OUT.json",
        type=output_file,
        help="write a merged Chrome trace of all ranks (for example out/trace.json)",
    )
    tr.add_argument("--lr", type=positive_number, default=0.05)
    mb_help = "bucket cap (the model is ~85K parameters)"
    tr.add_argument("--bucket-mb", type=bucket_mb, default=0.1, help=mb_help)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(run=cmd_train, parser=tr)


def _add_faults(tr) -> None:
    """commrt train's delay and fault injection, and what recovers from a fault."""
    tr.add_argument(
        "--straggler",
        metavar="SPEC,...",
        help="make ranks slow before every step: RANK:SECONDS for a fixed delay "
        "(e.g. 1:0.02), or a delay every rank draws each step: exp:MEAN_S, "
        "pareto:MEAN_S[:SHAPE] (default shape 2) or lognormal:MEAN_S[:SIGMA] "
        "(default 1), e.g. pareto:0.01",
    )
    tr.add_argument(
        "--kill",
        metavar="RANK:STEP",
        help="fault injection: rank RANK kills itself (SIGKILL) before step STEP; with "
        "--algorithm backup the others carry on",
    )
    tr.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="with --algorithm backup (gloo): start a replacement with the same RANK when "
        "a worker dies, up to N times in all; it rejoins the running job, catches up "
        "from a snapshot and takes part again, nobody else restarts (default 0)",
    )


def _add_trace(sub) -> None:
    trace = sub.add_parser("trace", help="work with Chrome-trace timelines")
    tsub = trace.add_subparsers(dest="what")
    merge = tsub.add_parser(
        "merge", help="merge per-rank trace files into one (open in ui.perfetto.dev)"
    )
    merge.add_argument(
        "-o", "--output", required=True, type=output_file, help="merged JSON file to write"
    )
    merge.add_argument("inputs", nargs="+", help="per-rank trace JSON files")
    merge.set_defaults(run=cmd_trace_merge, single_process=True, parser=merge)
    trace.set_defaults(parser=trace, subcommands=tuple(tsub.choices))


def cmd_train(options) -> int:
    """One rank of ``commrt train``, from the options :func:`check_train` built."""
    from commrt.cli.train import run

    return run(options)


def cmd_bench_kernels(args) -> int:
    from commrt.cli import bench

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "commrt bench kernels: --device cuda needs a CUDA GPU; none is available here",
            file=sys.stderr,
        )
        return 2
    sizes = args.sizes or [1 << 20, 4 << 20, 16 << 20, 64 << 20, 100 << 20]
    title = (
        f"commrt bench kernels · {device} · fp32 → {args.wire} bucket · "
        f"{'Triton' if device != 'cpu' else 'torch reference'}"
    )
    rows = bench.measure_kernels(sizes, DTYPES[args.wire], device)
    print(bench.kernel_table(rows, title))
    for path in bench.write_records(bench.kernel_records(rows), args.csv, args.json):
        print(f"# wrote {path}")
    if args.plot:
        print(f"# plot written to {bench.plot_kernels(rows, args.plot, title)}")
    return 0


def cmd_trace_merge(args) -> int:
    import os

    from commrt.training.trace import merge_traces

    missing = [p for p in args.inputs if not os.path.exists(p)]
    if missing:
        print(f"commrt trace merge: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        out = merge_traces(args.inputs, args.output)
    except ValueError as e:
        print(f"commrt trace merge: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(args.inputs)} traces into {out}")
    return 0


def _relaunch_or_run(args, argv: Sequence[str], parser, options=None) -> int:
    """Start the ranks, or be one of them (``options``: commrt train's checked options)."""
    backups = getattr(getattr(options, "algorithm", None), "backups", None)
    kill = getattr(options, "kill", None) is not None
    restarts = getattr(options, "max_restarts", 0)
    backend = check_backend(parser, args.backend, backups=backups is not None, kill=kill)
    if restarts and backend != "gloo":
        parser.error(
            f"--max-restarts with --backend {backend}: only gloo lets a replacement rejoin "
            f"a running job ({MPI_KILLS_ALL}; NCCL cannot add a rank either); pass "
            "--backend gloo (or leave --backend out)"
        )
    if args.nproc > 1 and not launcher.already_launched():
        child = list(argv) + ["--backend", backend]
        # the ranks take seconds to import torch and meet: say so at once
        print(f"starting {args.nproc} ranks ({backend})…", flush=True)
        # backup workers: the launcher hosts the control store (so any worker may die) and
        # lets up to b workers die without stopping the others
        code = launcher.launch(
            child,
            args.nproc,
            use_mpiexec=backend == "mpi",
            host_store=backups is not None,
            tolerate=backups or 0,
            restarts=restarts,
            # a backup worker the others left behind gets as long as any wait may take
            linger_s=getattr(args, "timeout", None),
        )
        if code == 0 and options is not None:  # the summary's times end before shut-down
            took = time.time() - launcher.launched_at()
            print(f"commrt train: done {took:.2f} s after the launch (shut-down included)")
        return code
    if options is not None:
        return args.run(dataclasses.replace(options, backend=backend))
    return args.run(argparse.Namespace(**{**vars(args), "backend": backend}))


def cmd_bench_allreduce(args) -> int:
    import commrt
    from commrt.cli import bench

    comm = commrt.init(args.backend, timeout=args.timeout)
    algorithms = [a for a in args.algorithms.split(",") if a]
    title = (
        f"commrt bench allreduce · backend {comm.backend.value} · {comm.world_size} ranks · "
        f"{args.dtype} · op sum"
    )
    native = f"native ({bench.NATIVE_NAMES[comm.backend.value]})"
    if comm.rank == 0:
        print(bench.table_header([*algorithms, native], comm.world_size, title), flush=True)

    def show(row):
        if comm.rank == 0:
            print(bench.table_row(row, comm.world_size), flush=True)

    rows = bench.measure_allreduce(
        comm,
        args.sizes or bench.DEFAULT_SIZES,
        algorithms,
        DTYPES[args.dtype],
        repeats=args.repeats,
        iters=args.iters,
        on_row=show,
    )
    if comm.rank == 0 and args.plot:
        print(f"# plot written to {bench.plot_rows(rows, comm.world_size, args.plot, title)}")
    if comm.rank == 0:
        for path in bench.write_records(bench.records(rows, comm.world_size), args.csv, args.json):
            print(f"# wrote {path}")
    comm.close()
    return 0


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
    traceback per rank (:func:`commrt.cli.launch.interrupted`)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return launcher.interrupted()


def _main(argv: Sequence[str] | None) -> int:
    argv = _negative_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    # errors after parsing belong to the subcommand: "commrt train: error: ..." with its usage
    sub = getattr(args, "parser", parser)
    if getattr(args, "run", None) is None:  # "commrt", "commrt bench": which one?
        sub.error(f"choose one of: {', '.join(args.subcommands)} (then --help for its flags)")
    options = check_train(sub, args) if args.command == "train" else None
    if getattr(args, "algorithms", None):
        from commrt.algorithms import resolve
        from commrt.schedule import Collective

        for a in args.algorithms.split(","):
            try:
                alg = resolve(a)
            except ValueError:
                names = tuple(
                    n for n in algorithm_choices() if resolve(n).supports(Collective.ALL_REDUCE)
                )
                sub.error(unknown_algorithm(a, names, "--algorithms"))
            if not alg.supports(Collective.ALL_REDUCE):
                sub.error(
                    f"{a} is not an all-reduce (gossip has a simulate section and "
                    f"bench/bench_gossip.py of its own)"
                )
    if getattr(args, "single_process", False):
        return args.run(args)
    return _relaunch_or_run(args, argv, sub, options)


if __name__ == "__main__":
    sys.exit(main())
