"""``commrt train``'s flags: declared (:func:`register`), then checked before any rank starts.

Every mistake ends in the subcommand's own ``parser.error``: one line that
names the flag and what would work, exit status 2, never a traceback or a
hang. Where the user left the batch at its default and it does not split
over ``--nproc`` ranks, the nearest batch that does is taken instead, and
one line on stdout says so.
"""

from __future__ import annotations

import argparse
import math

from commrt import settings
from commrt.cli import launch as launcher
from commrt.cli.flags import rank_flags
from commrt.cli.units import (
    DTYPES,
    bucket_mb,
    grid_shape,
    output_file,
    positive_int,
    positive_number,
)
from commrt.errors import did_you_mean

#: the global batch when neither --batch-size nor --batch-schedule is given
DEFAULT_BATCH = 64
#: the names --comm-dtype takes: short and long alike (as bench --dtype takes them)
COMM_DTYPES = [n for n in DTYPES if DTYPES[n] is not DTYPES["float64"]]


def register(sub) -> None:
    """Add ``train`` and its flags to ``commrt``'s sub-commands."""
    tr = sub.add_parser(
        "train",
        help="data-parallel training of an MLP on the digits dataset (CPU by default)",
        description="Train a small MLP on scikit-learn's digits dataset with --nproc ranks "
        "on this host (or as the ranks mpiexec or torchrun started), its gradients "
        "averaged by the chosen all-reduce, backup workers or gossip. It prints a "
        "progress bar, then a summary table: accuracy, step and communication times, "
        "the bytes each rank sent.",
    )
    rank_flags(tr)
    tr.add_argument(
        "--algorithm",
        default="ring",
        help="ring, halving_doubling, torus2d, auto, gossip, or backup (backup "
        "workers, see --backups; default ring)",
    )
    _gossip_flags(tr)
    tr.add_argument(
        "--torus-shape",
        metavar="ROWSxCOLS",
        type=grid_shape,
        help="grid for --algorithm torus2d, e.g. 2x2 (default: chosen from --nproc)",
    )
    tr.add_argument(
        "--epochs", type=positive_int, default=8, help="passes over the data (default 8)"
    )
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
        help="grow the global batch at epochs, e.g. 0:32,3:64,6:128 (lr scales linearly; "
        "default: --batch-size throughout)",
    )
    tr.add_argument(
        "--label-smoothing",
        type=float,
        default=0.1,
        help="for torch.nn.CrossEntropyLoss (default 0.1, as in Mikami et al.)",
    )
    tr.add_argument(
        "--comm-dtype",
        choices=COMM_DTYPES,
        default="fp32",
        metavar="DTYPE",
        help="the dtype gradients travel in: fp32, bf16, fp16 or their long names "
        "float32, bfloat16, float16 (default fp32)",
    )
    tr.add_argument(
        "--backups",
        type=int,
        default=None,
        metavar="B",
        help="with --algorithm backup: drop the last B of N+B gradients each step (default 1)",
    )
    tr.add_argument(
        "--dead-after",
        type=positive_number,
        default=None,
        metavar="S",
        help="with --algorithm backup: a rank with no heartbeat for S seconds is dropped "
        "as dead; raise it above any pause a live rank may take (default 2, or --timeout "
        "if smaller)",
    )
    _fault_flags(tr)
    _output_flags(tr)
    tr.set_defaults(run=cmd_train, parser=tr)


def _output_flags(tr) -> None:
    """commrt train's trace, optimiser, seed and what it prints."""
    tr.add_argument(
        "--trace",
        metavar="OUT.json",
        type=output_file,
        help="write a merged Chrome trace of all ranks (for example out/trace.json; default: none)",
    )
    tr.add_argument(
        "--lr",
        type=positive_number,
        default=0.05,
        help="SGD learning rate, momentum 0.9 (a --batch-schedule scales it with the "
        "batch; default 0.05)",
    )
    mb_help = "bucket cap in MB (the model is ~85K parameters; default 0.1)"
    tr.add_argument("--bucket-mb", type=bucket_mb, default=0.1, help=mb_help)
    tr.add_argument(
        "--seed", type=int, default=0, help="seed of the model, data split and order (default 0)"
    )
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.add_argument(
        "--verbose",
        action="store_true",
        help="when a peer fails, every rank's traceback too (default: one line that names "
        "the dead rank, its signal, the algorithm, bucket and training step)",
    )


def _fault_flags(tr) -> None:
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
        "--algorithm backup, or gossip with --gossip-deadline, the others carry on",
    )
    tr.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="with --algorithm backup, or gossip with --gossip-deadline (gloo): start a "
        "replacement with the same RANK when a worker dies, up to N times in all; it "
        "rejoins the running job, takes the parameters, optimizer state and step from a "
        "snapshot and takes part again, nobody else restarts (default 0)",
    )


def cmd_train(options) -> int:
    """One rank of ``commrt train``, from the options :func:`check_train` built."""
    from commrt.cli.train import run

    return run(options)


def algorithm_choices() -> tuple[str, ...]:
    """The names ``--algorithm`` accepts (the registry's, gossip and backup among them)."""
    from commrt.algorithms import NAMES

    return tuple(sorted({*NAMES, "gossip", "backup"}))


def unknown_algorithm(name: str, names: tuple[str, ...], flag: str = "--algorithm") -> str:
    """The error for a name the registry does not know, in command-line terms."""
    return f"unknown algorithm {name!r} for {flag}; it takes {', '.join(names)}" + did_you_mean(
        name, names
    )


def check_train(parser: argparse.ArgumentParser, args):
    """Reject bad flags before any rank starts, with the reason; the checked options
    (a :class:`commrt.cli.train_options.TrainOptions`; ``args`` stays as parsed). Imports
    no torch: the launcher checks them too, and only its ranks import torch."""
    from commrt.cli.train_options import TrainOptions

    nproc, rank = args.nproc, 0
    if launcher.already_launched():
        from commrt.process.environment import detect_launch

        nproc, rank = detect_launch().world_size, detect_launch().rank
    fix = _batch_fix(args, nproc)
    alg = _train_algorithm(parser, args, nproc, fix)
    sched = _train_batches(parser, args, nproc, fix, announce=rank == 0)
    straggler = _straggler(parser, args, nproc)
    kill = _kill(parser, args.kill, nproc) if args.kill else None
    _check_restarts(parser, args.max_restarts, alg)
    if not 0.0 <= args.label_smoothing < 1.0:
        parser.error("--label-smoothing must be in [0, 1)")
    return TrainOptions(
        backend=args.backend,
        timeout=args.timeout,
        algorithm=alg,
        epochs=args.epochs,
        lr=args.lr,
        batch_schedule=sched,
        label_smoothing=args.label_smoothing,
        comm_dtype=DTYPES[args.comm_dtype],
        bucket_mb=args.bucket_mb,
        seed=args.seed,
        straggler=straggler,
        kill=kill,
        max_restarts=args.max_restarts,
        trace=args.trace,
        quiet=args.quiet,
        verbose=args.verbose,
    )


def _train_algorithm(parser: argparse.ArgumentParser, args, nproc: int, batch_fix: str):
    """The algorithm instance ``commrt train``'s flags ask for, checked against ``nproc``
    (``batch_fix``: the batch flag the user must change too, if any)."""
    from commrt.algorithms import Gossip, Torus2D, resolve

    try:
        alg = resolve(args.algorithm)
    except ValueError:
        parser.error(unknown_algorithm(args.algorithm, algorithm_choices()))
    if args.torus_shape:
        if alg.name != "torus2d":
            parser.error("--torus-shape only applies to --algorithm torus2d")
        rows, cols = args.torus_shape  # (rows, cols): units.grid_shape parsed it
        if rows * cols != nproc:
            fits = ", ".join(f"{r}x{nproc // r}" for r in range(1, nproc + 1) if nproc % r == 0)
            parser.error(
                f"--torus-shape {rows}x{cols} has {rows * cols} ranks but --nproc is {nproc} "
                f"(rows × cols must equal p, the ranks); give a shape of {nproc} ranks "
                f"({fits}), or leave --torus-shape out to choose one"
            )
        try:
            alg = Torus2D(rows=rows, cols=cols)
            alg.schedule(nproc)
        except ValueError as e:
            parser.error(f"--torus-shape {rows}x{cols} with --nproc {nproc}: {e}")
    if args.backups is not None or args.dead_after is not None or alg.name == "backup":
        from commrt.algorithms import BackupWorkers

        if alg.name != "backup":
            parser.error("--backups and --dead-after only apply to --algorithm backup")
        dead_after = min(BackupWorkers.dead_after_s, args.timeout)
        if args.dead_after is not None and args.dead_after >= args.timeout:
            parser.error(
                f"--dead-after {args.dead_after:g} s is not under --timeout "
                f"{args.timeout:g} s: a silent rank would fail the others' waits before "
                "it is found dead; give less, or raise --timeout"
            )
        try:
            alg = BackupWorkers(
                backups=1 if args.backups is None else args.backups,
                dead_after_s=dead_after if args.dead_after is None else args.dead_after,
            )
            alg.participants(nproc)
        except ValueError as e:
            parser.error(f"--backups with --nproc {nproc}: {e}")
    if args.gossip_topology or args.gossip_async or args.gossip_deadline is not None:
        if alg.name != "gossip":
            parser.error(
                "--gossip-topology, --gossip-async and --gossip-deadline only apply to "
                "--algorithm gossip"
            )
        alg = Gossip(
            args.gossip_topology or "hypercube",
            asynchronous=args.gossip_async,
            deadline_s=args.gossip_deadline,
        )
    if alg.name == "gossip":
        try:
            alg.period_length(nproc)
        except ValueError:
            low = 1 << (nproc.bit_length() - 1)
            parser.error(
                f"--algorithm gossip with --nproc {nproc}: the hypercube topology needs a "
                f"power-of-two number of ranks, got {nproc}; add --gossip-topology "
                f"dissemination (any --nproc){' and ' + batch_fix if batch_fix else ''}, "
                f"or use --nproc {low} or {low * 2}"
            )
    return alg


def nearest_multiple(batch: int, nproc: int) -> int:
    """The multiple of ``nproc`` nearest ``batch`` (the smaller on a tie; at least ``nproc``)."""
    lo = batch // nproc * nproc
    return lo if lo and batch - lo <= lo + nproc - batch else lo + nproc


def _batch_fix(args, nproc: int) -> str:
    """The batch flag (with a value that splits over ``nproc``) the user should pass instead
    of theirs; "" when theirs splits, or when they gave none (a default is then picked)."""
    from commrt.training.recipe import BatchSizeSchedule

    if args.batch_schedule:
        try:
            sched = BatchSizeSchedule.parse(args.batch_schedule)
        except ValueError:
            return ""  # _train_batches says what is wrong with it
        if all(b % nproc == 0 for _, b in sched.batches):
            return ""
        fixed = ",".join(f"{e}:{nearest_multiple(b, nproc)}" for e, b in sched.batches)
        return f"--batch-schedule {fixed}"
    if args.batch_size is not None and args.batch_size % nproc:
        return f"--batch-size {nearest_multiple(args.batch_size, nproc)}"
    return ""


def _train_batches(
    parser: argparse.ArgumentParser, args, nproc: int, fix: str, announce: bool = True
):
    """The batch-size schedule, checked to split over ``nproc`` ranks and fit the data
    (``announce``: say on stdout when a default batch was changed to split)."""
    from commrt.cli.train_options import TRAIN_SAMPLES
    from commrt.training.recipe import BatchSizeSchedule

    base = DEFAULT_BATCH if args.batch_size is None else args.batch_size
    if not args.batch_schedule and args.batch_size is None and base % nproc:
        base = nearest_multiple(DEFAULT_BATCH, nproc)
        # the launcher says it once; its ranks (and mpiexec's other ranks) stay quiet
        if announce and not settings.LAUNCHED.text():
            print(
                f"global batch {base} ({base // nproc} per rank): {DEFAULT_BATCH} does not "
                f"split over {nproc} ranks (--batch-size)",
                flush=True,
            )
    try:
        sched = (
            BatchSizeSchedule.parse(args.batch_schedule)
            if args.batch_schedule
            else BatchSizeSchedule(base=base)
        )
        for e in range(args.epochs):
            sched.per_rank_batch(e, nproc)
    except ValueError as e:
        if fix:
            parser.error(f"batch size: it must split evenly over {nproc} ranks; use {fix}")
        parser.error(f"batch size: {e}")
    too_big = [
        (e, sched.batch_size(e)) for e in range(args.epochs) if sched.batch_size(e) > TRAIN_SAMPLES
    ]
    if too_big:
        e, b = too_big[0]
        parser.error(
            f"batch size: the global batch at epoch {e} is {b}, larger than the "
            f"{TRAIN_SAMPLES} training samples of the digits data, so no step would run; "
            f"use at most {TRAIN_SAMPLES}"
        )
    return sched


def _straggler(parser: argparse.ArgumentParser, args, nproc: int):
    """--straggler as a :class:`commrt.cli.train_faults.Stragglers`, its ranks and delays
    checked."""
    from commrt.cli.train_faults import Stragglers

    if not args.straggler:
        return None
    text = args.straggler
    try:
        s = Stragglers.parse(text, args.seed)
    except ValueError as e:
        parser.error(f"bad --straggler {text!r}: {e}")
    if any(not 0 <= r < nproc for r, _ in s.fixed):
        parser.error(f"--straggler names a rank outside 0..{nproc - 1}")
    delays = [(f"a delay of {sec:g} s", sec) for _, sec in s.fixed]
    if s.draw is not None:
        delays.append((f"a mean delay of {s.draw.mean_s:g} s", s.draw.mean_s))
    for what, sec in delays:
        if not math.isfinite(sec) or sec >= args.timeout:
            parser.error(
                f"--straggler {text}: {what} before every step cannot finish within "
                f"--timeout {args.timeout:g} s (the other ranks give up waiting then); give "
                f"well under {args.timeout:g} s, or raise --timeout"
            )
    return s


def _check_restarts(parser: argparse.ArgumentParser, n: int, alg) -> None:
    """--max-restarts N: a count, for backup workers and gossip with a deadline (the others
    cannot lose a rank)."""
    if n < 0:
        parser.error(f"--max-restarts must be 0 or more, got {n}")
    if n and alg.family not in ("backup", "gossip-deadline"):
        parser.error(
            f"--max-restarts needs --algorithm backup, or gossip with --gossip-deadline: a "
            f"replacement rejoins only those, whose other ranks carry on while a rank is "
            f"dead (not {alg.name} without a deadline)"
        )


def _gossip_flags(tr: argparse.ArgumentParser) -> None:
    """The flags of --algorithm gossip."""
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
        "--gossip-deadline",
        metavar="{off,auto,SECONDS}",
        type=deadline,
        default=None,
        help="for --algorithm gossip: never wait longer for a partner's message; a late "
        "one is applied when it lands (auto: 4x the median measured exchange time; "
        "default off)",
    )


def deadline(text: str) -> float | str | None:
    """--gossip-deadline: ``off`` (None), ``auto``, or a positive number of seconds."""
    if text in ("off", "auto"):
        return None if text == "off" else "auto"
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(
            f"expected off, auto or a positive number of seconds, got {text!r}"
        )
    return seconds


def _kill(parser: argparse.ArgumentParser, text: str, nproc: int) -> tuple[int, int]:
    """--kill RANK:STEP as (rank, step)."""
    try:
        r, step = (int(v) for v in text.split(":"))
    except ValueError:
        parser.error(f"bad --kill {text!r}; use RANK:STEP, e.g. 3:20")
    if not 0 <= r < nproc or step < 0:
        parser.error(f"--kill {text}: the rank must be in 0..{nproc - 1} and the step >= 0")
    return r, step
