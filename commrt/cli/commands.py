"""The ``commrt`` command line.

* ``commrt train``: data-parallel training on the digits dataset, with a
  progress bar and a summary table;
* ``commrt bench allreduce``: all-reduce per algorithm next to the engine's
  own (nccl-tests style table, optional PNG); ``commrt bench kernels``:
  pack/unpack GB/s;
* ``commrt trace merge``: one timeline from per-rank traces;
* ``commrt simulate``: all-reduce at thousands of ranks under an α-β model.

With ``--nproc N`` the multi-rank commands start N local ranks themselves
(mpiexec for mpi, subprocesses for gloo); under mpiexec or torchrun they
run as one of the ranks.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch

from commrt.cli import launch as launcher
from commrt.cli.units import positive_int, size_list

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


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
    p.add_argument("--nproc", type=positive_int, default=2, help="ranks to start on this machine (default 2)")
    p.add_argument("--backend", choices=["auto", "mpi", "gloo", "nccl"], default="auto",
                   help="auto: nccl with a GPU, else mpi if installed, else gloo")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any wait may take (default 300)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commrt", description="commrt: data-parallel training, benchmarks and simulation of its "
                                   "communication runtime. Run 'commrt COMMAND --help' for a command's flags.")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="measure collectives")
    bsub = bench.add_subparsers(dest="what", required=True)
    ar = bsub.add_parser("allreduce", help="all-reduce: commrt algorithms vs the native engine")
    _common(ar)
    ar.add_argument("--algorithms", default="auto,ring,halving_doubling,recursive_doubling,torus2d",
                    help="comma-separated algorithm names "
                         "(default auto,ring,halving_doubling,recursive_doubling,torus2d)")
    ar.add_argument("--sizes", type=size_list, default=None,
                    help="comma-separated sizes (default 8,4K, then 64K..64M, x4)")
    ar.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ar.add_argument("--repeats", type=positive_int, default=3, help="timed runs per point (median)")
    ar.add_argument("--iters", type=positive_int, default=None,
                    help="calls per timed run (default: from the size, ~0.4 GB moved per run)")
    ar.add_argument("--plot", metavar="PNG", help="also write busbw vs size to this PNG file")
    ar.set_defaults(run=cmd_bench_allreduce, parser=ar)
    kb = bsub.add_parser("kernels", help="pack/unpack GB/s vs a plain copy and cat+scale (one process)")
    kb.add_argument("--sizes", type=size_list, default=None, help="bucket sizes (default 1M,4M,16M,64M,100M)")
    kb.add_argument("--wire", choices=sorted(DTYPES), default="float32", help="bucket (wire) dtype")
    kb.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    kb.add_argument("--plot", metavar="PNG", help="also write GB/s vs size to this PNG file")
    kb.set_defaults(run=cmd_bench_kernels, single_process=True, parser=kb)

    tr = sub.add_parser("train", help="data-parallel training of an MLP on the digits dataset (CPU by default)")
    _common(tr)
    tr.add_argument("--algorithm", default="ring",
                    help="ring, halving_doubling, torus2d, auto, gossip, or backup (backup "
                         "workers, see --backups; default ring)")
    tr.add_argument("--gossip-topology", choices=["hypercube", "dissemination"], default=None,
                    help="for --algorithm gossip (default hypercube; dissemination handles "
                         "any --nproc)")
    tr.add_argument("--gossip-async", action="store_true",
                    help="for --algorithm gossip: apply each step's mix one step later, overlapped")
    tr.add_argument("--torus-shape", metavar="ROWSxCOLS", help="grid for --algorithm torus2d, e.g. 2x2")
    tr.add_argument("--epochs", type=positive_int, default=8)
    tr.add_argument("--batch-size", type=positive_int, default=64, help="global batch (all ranks together)")
    tr.add_argument("--batch-schedule", metavar="EPOCH:BATCH,...",
                    help="grow the global batch at epochs, e.g. 0:32,3:64,6:128 (lr scales linearly)")
    tr.add_argument("--label-smoothing", type=float, default=0.1,
                    help="for torch.nn.CrossEntropyLoss (default 0.1, as in Mikami et al.)")
    tr.add_argument("--comm-dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="wire dtype")
    tr.add_argument("--backups", type=int, default=None, metavar="B",
                    help="with --algorithm backup: drop the last B of N+B gradients each step "
                         "(default 1)")
    tr.add_argument("--straggler", metavar="SPEC,...",
                    help="make ranks slow before every step: RANK:SECONDS for a fixed delay "
                         "(e.g. 1:0.02), or a delay every rank draws each step: exp:MEAN_S, "
                         "pareto:MEAN_S[:SHAPE] (default shape 2) or lognormal:MEAN_S[:SIGMA] "
                         "(default 1), e.g. pareto:0.01")
    tr.add_argument("--kill", metavar="RANK:STEP",
                    help="fault injection: rank RANK kills itself (SIGKILL) before step STEP; with "
                         "--algorithm backup the others carry on")
    tr.add_argument("--trace", metavar="OUT.json", help="write a merged Chrome trace of all ranks")
    tr.add_argument("--lr", type=float, default=0.05)
    tr.add_argument("--bucket-mb", type=float, default=0.1, help="bucket cap (the model is ~85K parameters)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(run=cmd_train, parser=tr)

    trace = sub.add_parser("trace", help="work with Chrome-trace timelines")
    tsub = trace.add_subparsers(dest="what", required=True)
    merge = tsub.add_parser("merge", help="merge per-rank trace files into one (open in ui.perfetto.dev)")
    merge.add_argument("-o", "--output", required=True, help="merged JSON file to write")
    merge.add_argument("inputs", nargs="+", help="per-rank trace JSON files")
    merge.set_defaults(run=cmd_trace_merge, single_process=True, parser=merge)

    from commrt.cli import simulate
    simulate.register(sub)
    return parser


def _straggler(text: str, seed: int = 0):
    from commrt.cli.train import Stragglers
    try:
        return Stragglers.parse(text, seed)
    except ValueError as e:
        raise ValueError(f"bad --straggler {text!r}: {e}") from None


def check_train(parser: argparse.ArgumentParser, args) -> None:
    """Reject bad flags before any rank starts, with the reason."""
    from commrt.algorithms import Gossip, Torus2D, resolve
    from commrt.recipe import BatchSizeSchedule
    try:
        alg = resolve(args.algorithm)
    except ValueError as e:
        parser.error(str(e))
    nproc = args.nproc
    if launcher.already_launched():
        from commrt.comm import detect_launch
        nproc = detect_launch().world_size
    if args.torus_shape:
        if alg.name != "torus2d":
            parser.error("--torus-shape only applies to --algorithm torus2d")
        try:
            rows, cols = (int(v) for v in args.torus_shape.lower().split("x"))
            alg = Torus2D(rows=rows, cols=cols)
            alg.schedule(nproc)
        except ValueError as e:
            parser.error(f"--torus-shape {args.torus_shape} with --nproc {nproc}: {e}")
    if args.backups is not None or alg.name == "backup":
        from commrt.algorithms import BackupWorkers
        if alg.name != "backup":
            parser.error("--backups only applies to --algorithm backup")
        try:
            alg = BackupWorkers(backups=1 if args.backups is None else args.backups,
                                dead_after_s=min(10.0, args.timeout))
            alg.participants(nproc)
        except ValueError as e:
            parser.error(f"--backups with --nproc {nproc}: {e}")
    if args.gossip_topology or args.gossip_async:
        if alg.name != "gossip":
            parser.error("--gossip-topology and --gossip-async only apply to --algorithm gossip")
        alg = Gossip(args.gossip_topology or "hypercube", asynchronous=args.gossip_async)
    if alg.name == "gossip":
        try:
            alg.period_length(nproc)
        except ValueError as e:
            parser.error(f"--algorithm gossip with --nproc {nproc}: {e} "
                         f"(here: --gossip-topology dissemination)")
    args.algorithm = alg
    try:
        sched = (BatchSizeSchedule.parse(args.batch_schedule) if args.batch_schedule
                 else BatchSizeSchedule(base=args.batch_size))
        for e in range(args.epochs):
            sched.per_rank_batch(e, nproc)
    except ValueError as e:
        parser.error(f"batch size: {e}")
    args.batch_schedule_obj = sched
    from commrt.cli.train import TRAIN_SAMPLES
    too_big = [(e, sched.batch_size(e)) for e in range(args.epochs) if sched.batch_size(e) > TRAIN_SAMPLES]
    if too_big:
        e, b = too_big[0]
        parser.error(f"batch size: the global batch at epoch {e} is {b}, larger than the {TRAIN_SAMPLES} "
                     f"training samples of the digits data, so no step would run; use at most {TRAIN_SAMPLES}")
    args.comm_dtype_obj = DTYPES[args.comm_dtype]
    try:
        args.straggler = _straggler(args.straggler, args.seed) if args.straggler else None
    except ValueError as e:
        parser.error(str(e))
    if args.straggler and any(not 0 <= r < nproc for r, _ in args.straggler.fixed):
        parser.error(f"--straggler names a rank outside 0..{nproc - 1}")
    if args.kill:
        try:
            r, step = (int(v) for v in args.kill.split(":"))
        except ValueError:
            parser.error(f"bad --kill {args.kill!r}; use RANK:STEP, e.g. 3:20")
        if not 0 <= r < nproc or step < 0:
            parser.error(f"--kill {args.kill}: the rank must be in 0..{nproc - 1} "
                         f"and the step >= 0")
        args.kill = (r, step)
    if not 0.0 <= args.label_smoothing < 1.0:
        parser.error("--label-smoothing must be in [0, 1)")
    if args.lr <= 0 or args.bucket_mb <= 0:
        parser.error("--lr and --bucket-mb must be positive")


def cmd_train(args) -> int:
    from commrt.cli.train import run
    return run(args)


def cmd_bench_kernels(args) -> int:
    from commrt.cli import bench
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("commrt bench kernels: --device cuda needs a CUDA GPU; none is available here", file=sys.stderr)
        return 2
    sizes = args.sizes or [1 << 20, 4 << 20, 16 << 20, 64 << 20, 100 << 20]
    title = (f"commrt bench kernels · {device} · fp32 gradients → {args.wire} bucket · "
             f"{'Triton' if device != 'cpu' else 'torch reference path'}")
    rows = bench.measure_kernels(sizes, DTYPES[args.wire], device)
    print(bench.kernel_table(rows, title))
    if args.plot:
        print(f"# plot written to {bench.plot_kernels(rows, args.plot, title)}")
    return 0


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
        child = list(argv) + ["--backend", backend]
        # the ranks take seconds to import torch and meet: say so at once
        print(f"starting {args.nproc} ranks ({backend})…", flush=True)
        # backup workers: the launcher hosts the control store (so any worker may die) and
        # lets up to b workers die without stopping the others
        backups = getattr(getattr(args, "algorithm", None), "backups", None)
        return launcher.launch(child, args.nproc, use_mpiexec=backend == "mpi",
                               host_store=backups is not None, tolerate=backups or 0)
    args.backend = backend
    return args.run(args)


def cmd_bench_allreduce(args) -> int:
    import commrt
    from commrt.cli import bench
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
                                   repeats=args.repeats, iters=args.iters, on_row=show)
    if comm.rank == 0 and args.plot:
        print(f"# plot written to {bench.plot_rows(rows, comm.world_size, args.plot, title)}")
    comm.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    # errors after parsing belong to the subcommand: "commrt train: error: ..." with its usage
    sub = getattr(args, "parser", parser)
    if args.command == "train":
        check_train(sub, args)
    if getattr(args, "algorithms", None):
        from commrt.algorithms import resolve
        from commrt.schedule import Collective
        for a in args.algorithms.split(","):
            try:
                alg = resolve(a)
            except ValueError as e:
                sub.error(str(e))
            if not alg.supports(Collective.ALL_REDUCE):
                sub.error(f"{a} is not an all-reduce (gossip has a simulate section and "
                          f"bench/bench_gossip.py of its own)")
    if getattr(args, "single_process", False):
        return args.run(args)
    return _relaunch_or_run(args, argv, sub)


if __name__ == "__main__":
    sys.exit(main())
