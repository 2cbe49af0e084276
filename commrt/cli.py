"""The ``commrt`` command line.

``commrt bench allreduce`` measures all-reduce per algorithm next to the
engine's own (nccl-tests style table, optional PNG). With ``--nproc N`` it
starts N local ranks itself (mpiexec for mpi, subprocesses for gloo); under
mpiexec or torchrun it runs as one of the ranks.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import Sequence

import torch

from commrt import launch as launcher

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def parse_size(text: str) -> int:
    """'64K', '1M', '16MB', '1GiB', '4096' -> bytes (powers of two)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)i?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 64K, 1M, 16MB")
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)])


def _sizes(text: str) -> list[int]:
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError("sizes must be positive")
    return sizes


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def default_backend() -> str:
    """auto on the command line: nccl with a GPU, mpi when mpi4py and mpiexec exist, else gloo."""
    if torch.cuda.is_available():
        return "nccl"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "gloo"
    return "mpi" if launcher.mpiexec_path() else "gloo"


def check_backend(parser: argparse.ArgumentParser, backend: str) -> str:
    if backend == "auto":
        return default_backend()
    if backend == "nccl" and not torch.cuda.is_available():
        parser.error("--backend nccl needs a CUDA GPU and none is available here; use --backend mpi or gloo")
    if backend == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            parser.error("--backend mpi needs mpi4py: pip install 'commrt[mpi]', or use --backend gloo")
        if not launcher.already_launched() and launcher.mpiexec_path() is None:
            parser.error("--backend mpi needs mpiexec on PATH (pip install mpich), or use --backend gloo")
    return backend


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=_positive, default=2, help="ranks to start on this machine (default 2)")
    p.add_argument("--backend", choices=["auto", "mpi", "gloo", "nccl"], default="auto",
                   help="auto: nccl with a GPU, else mpi if installed, else gloo")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any wait may take (default 300)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commrt", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="measure collectives")
    bsub = bench.add_subparsers(dest="what", required=True)
    ar = bsub.add_parser("allreduce", help="all-reduce: commrt algorithms vs the native engine")
    _common(ar)
    ar.add_argument("--algorithms", default="ring,halving_doubling",
                    help="comma-separated algorithm names (default ring,halving_doubling)")
    ar.add_argument("--sizes", type=_sizes, default=None, help="comma-separated sizes (default 64K..64M, x4)")
    ar.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ar.add_argument("--repeats", type=_positive, default=3)
    ar.add_argument("--plot", metavar="PNG", help="also write busbw vs size to this PNG file")
    ar.set_defaults(run=cmd_bench_allreduce)

    trace = sub.add_parser("trace", help="work with Chrome-trace timelines")
    tsub = trace.add_subparsers(dest="what", required=True)
    merge = tsub.add_parser("merge", help="merge per-rank trace files into one (open in ui.perfetto.dev)")
    merge.add_argument("-o", "--output", required=True, help="merged JSON file to write")
    merge.add_argument("inputs", nargs="+", help="per-rank trace JSON files")
    merge.set_defaults(run=cmd_trace_merge, single_process=True)
    return parser


def cmd_trace_merge(args) -> int:
    import os
    from commrt.trace import merge_traces
    missing = [p for p in args.inputs if not os.path.exists(p)]
    if missing:
        print(f"commrt trace merge: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(f"merged {len(args.inputs)} traces into {merge_traces(args.inputs, args.output)}")
    return 0


def _relaunch_or_run(args, argv: Sequence[str], parser) -> int:
    backend = check_backend(parser, args.backend)
    if args.nproc > 1 and not launcher.already_launched():
        child = [a for a in argv]
        child += ["--backend", backend]
        return launcher.launch(child, args.nproc, use_mpiexec=backend == "mpi")
    args.backend = backend
    return args.run(args)


def cmd_bench_allreduce(args) -> int:
    import commrt
    from commrt import bench
    comm = commrt.init(args.backend, timeout=args.timeout)
    algorithms = [a for a in args.algorithms.split(",") if a]
    title = (f"commrt bench allreduce · backend {comm.backend.value} · {comm.world_size} ranks · "
             f"{args.dtype} · op sum")
    native = f"native ({bench.NATIVE_NAMES[comm.backend.value]})"
    if comm.rank == 0:
        print(bench.table_header([*algorithms, native], comm.world_size, title), flush=True)

    def show(row):
        if comm.rank == 0:
            print(bench.table_row(row, comm.world_size), flush=True)

    rows = bench.measure_allreduce(comm, args.sizes or bench.DEFAULT_SIZES, algorithms, DTYPES[args.dtype],
                                   repeats=args.repeats, on_row=show)
    if comm.rank == 0 and args.plot:
        print(f"# plot written to {bench.plot_rows(rows, comm.world_size, args.plot, title)}")
    comm.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "algorithms", None):
        from commrt.algorithms import resolve
        for a in args.algorithms.split(","):
            try:
                resolve(a)
            except ValueError as e:
                parser.error(str(e))
    if getattr(args, "single_process", False):
        return args.run(args)
    return _relaunch_or_run(args, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
