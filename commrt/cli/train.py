"""``commrt train``: data-parallel training of a small model on a real dataset.

The dataset is scikit-learn's handwritten digits (1797 8×8 images, 10
classes; nothing is downloaded). Each epoch every rank takes its slice of one global shuffle
(the same permutation everywhere, from the seed and the epoch), trains an
MLP with commrt's :class:`~commrt.GradientSync`, and the ranks evaluate on
the held-out 20% together (correct/total summed with ``commrt.all_reduce``).
With ``--algorithm gossip`` each rank instead starts from its own disjoint
shard, gossip-shuffled every epoch (:class:`commrt.data.GossipShuffle`),
and the models are averaged exactly (:func:`commrt.average_parameters`) at
the end of every epoch, before evaluating; the summary shows how far apart
they were.

Rank 0 shows a progress bar (loss, accuracy, samples/s, communication
share) and ends with a summary table (both drawn by :mod:`commrt.cli.train_output`).
The data, its sharding and the evaluation are :mod:`commrt.cli.train_data`'s,
the injected delays :mod:`commrt.cli.train_faults`'s.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from dataclasses import dataclass, field

import torch

import commrt
from commrt.cli.launch import launched_at
from commrt.cli.startup import BROADCAST, DATA, MEETING, PROCESSES, Startup
from commrt.cli.traces import merge_rank_traces, save_rank_trace
from commrt.cli.train_data import Digits, Sharding, evaluate, load_digits
from commrt.cli.train_faults import in_cli_terms, peer_failed
from commrt.cli.train_options import TrainOptions
from commrt.cli.train_output import (
    ProgressBar,
    caught_up_line,
    epoch_line,
    render_summary,
    step_line,
    summary_rows,
)
from commrt.errors import CommError, RendezvousTimeoutError
from commrt.process.environment import rejoining
from commrt.sync.backup import RejoinedTooLate
from commrt.sync.report import SyncReport


def make_model(seed: int, hidden: int = 256) -> torch.nn.Module:
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


# ----------------------------------------------------------- data, set-up


@dataclass
class Setup:
    """One rank's training ingredients (built by :func:`set_up`)."""

    opts: TrainOptions
    comm: commrt.Communicator
    data: Digits
    sharding: Sharding
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: torch.nn.Module
    #: steps of the whole run (global steps where ranks run at their own pace)
    total_steps: int


def set_up(opts: TrainOptions, comm) -> Setup:
    """Data on this rank's device, its sharding, the model and its optimizer."""
    data = load_digits(opts.seed)
    if comm.device.type != "cpu":  # nccl: model and data live on this rank's GPU
        data = Digits(
            *(t.to(comm.device) for t in (data.x_train, data.y_train, data.x_test, data.y_test))
        )
    model = make_model(opts.seed).to(comm.device)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=opts.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=0.9)
    sharding = Sharding(opts.algorithm, data, comm, opts.seed, swap=opts.averages_each_epoch)
    total = sum(sharding.steps(opts.batch_schedule.batch_size(e)) for e in range(opts.epochs))
    return Setup(opts, comm, data, sharding, model, optimizer, loss_fn, total)


def gradient_sync(s: Setup) -> commrt.GradientSync:
    opts = s.opts
    return commrt.GradientSync(
        s.model,
        s.comm,
        algorithm=opts.algorithm,
        bucket_mb=opts.bucket_mb,
        first_bucket_mb=min(1.0, opts.bucket_mb),
        comm_dtype=None if opts.comm_dtype is None else getattr(torch, opts.comm_dtype),
        trace=bool(opts.trace),
    )


# --------------------------------------------------------------- training


@dataclass
class Outcome:
    """What training produced on this rank."""

    #: the last evaluation's test accuracy (None before the first)
    accuracy: float | None = None
    samples: int = 0
    wall_s: float = 0.0
    #: per epoch, how far apart the models were when averaged (families whose models drift)
    disagreements: list[float] = field(default_factory=list)
    #: local steps taken (stragglers and --kill count them)
    step_no: int = 0
    #: seconds from the launch to the first step: processes, imports, init, set-up
    startup_s: float = 0.0
    #: the start-up's phases and their seconds (:class:`commrt.cli.startup.Startup`)
    startup_phases: list[tuple[str, float]] = field(default_factory=list)


def _done(sync: commrt.GradientSync, traits: SyncReport, total_steps: int) -> bool:
    """This rank may stop: its family says so, or, where ranks run at their own pace
    (and may fail), it holds the planned global steps."""
    return sync.finished or (traits.ranks_may_fail and sync.global_step >= total_steps)


def _epoch(
    s: Setup, sync, traits: SyncReport, out: Outcome, epoch: int, bar: ProgressBar, t_start: float
) -> list[float]:
    """One epoch's steps; their losses."""
    opts, comm = s.opts, s.comm
    gb = opts.batch_schedule.batch_size(epoch)
    losses = []
    for xb, yb in s.sharding.batches(epoch, gb):
        if opts.kill == (comm.rank, out.step_no) and not rejoining():
            os.kill(os.getpid(), signal.SIGKILL)
        if opts.straggler:
            time.sleep(opts.straggler.delay(comm.rank, out.step_no))
        out.step_no += 1
        loss = s.loss_fn(s.model(xb), yb)
        loss.backward()
        applied = sync.step(s.optimizer)
        losses.append(loss.item())
        out.samples += gb
        last = sync.stats.last
        comm_share = last.exposed_s / max(last.step_s, 1e-9)
        rate = out.samples / (time.perf_counter() - t_start)
        # at their own pace ranks count global steps (a late rank catches up several)
        bar.update(
            applied if traits.ranks_may_fail else 1,
            step_line(epoch, opts.epochs, losses[-1], rate, comm_share),
        )
        if _done(sync, traits, s.total_steps):
            break
    return losses


def train(s: Setup, sync: commrt.GradientSync, bar: ProgressBar, out: Outcome) -> Outcome:
    """Every epoch: its steps, then (models that drift) exact averaging, then evaluation;
    ``out`` (the start-up's already) filled as they go.

    Each epoch ends with its line, the last one too (a family whose ranks stop at the
    planned global step may stop inside an epoch), so the last line shows the last
    evaluation."""
    opts, comm = s.opts, s.comm
    traits = sync.report()
    t_start = time.perf_counter()
    for epoch in range(opts.epochs):
        gb = opts.batch_schedule.batch_size(epoch)
        if gb % comm.world_size:
            raise ValueError(
                f"global batch {gb} at epoch {epoch} does not split over {comm.world_size} ranks"
            )
        for group in s.optimizer.param_groups:
            group["lr"] = opts.batch_schedule.lr(epoch, opts.lr)
        t_epoch = time.perf_counter()
        losses = _epoch(s, sync, traits, out, epoch, bar, t_start)
        if traits.models_drift and opts.averages_each_epoch:
            out.disagreements.append(commrt.average_parameters(s.model, comm, s.optimizer))
        out.accuracy = evaluate(s.model, s.data, comm, local=traits.ranks_may_fail)
        epoch_rate = len(losses) * gb / max(time.perf_counter() - t_epoch, 1e-9)
        bar.line(
            epoch_line(epoch, opts.epochs, losses, out.accuracy, out.disagreements, epoch_rate, gb)
        )
        if _done(sync, traits, s.total_steps):
            break
    if epoch < opts.epochs - 1:  # the others' steps ended the job: say so as its last epoch
        bar.line(caught_up_line(epoch + 1, opts.epochs, sync.global_step, out.accuracy))
    bar.close()
    out.wall_s = time.perf_counter() - t_start
    return out


# ------------------------------------------------------------------- run


def open_sync(s: Setup):
    """The job's GradientSync, or None for a replacement that came after every other rank
    finished (nothing is lost: it says so in one line and leaves)."""
    try:
        return gradient_sync(s)
    except RejoinedTooLate as e:
        line = textwrap.fill(f"{e}; this replacement leaves", 80, subsequent_indent="  ")
        print(line, file=sys.stderr, flush=True)
        return None


def run(opts: TrainOptions) -> int:
    """One rank of ``commrt train`` (the CLI launches the ranks)."""
    startup = opts.startup
    if startup is None:  # started otherwise than by commrt's own entry: from the launch
        startup = Startup(launched_at(), say=False)
        startup.begin(PROCESSES, now=launched_at())
    startup.begin(MEETING)
    try:
        comm = commrt.init(opts.backend, timeout=opts.timeout)
    except RendezvousTimeoutError as e:  # a rank never came: one line, unless --verbose
        if opts.verbose:
            raise
        line = textwrap.fill(in_cli_terms(e), 80, subsequent_indent="  ")
        print(line, file=sys.stderr, flush=True)
        return 1
    startup.begin(DATA)
    s = set_up(opts, comm)
    startup.begin(BROADCAST)
    sync = open_sync(s)
    if sync is None:
        comm.close()
        return 0
    with sync:
        # the start-up ends here, at the first step: no phase is named over the bar
        out = Outcome(startup_s=max(0.0, startup.end()), startup_phases=startup.breakdown())
        bar = ProgressBar(s.total_steps, enabled=comm.rank == 0 and not opts.quiet)
        try:
            out = train(s, sync, bar, out)
        except CommError as e:  # a peer died or stopped: one line, unless --verbose
            if opts.verbose:
                raise
            peer_failed(comm.rank, sync.global_step, e, comm.backend)
        save_rank_trace(opts.trace, sync, comm.rank)
        if sync.report().closing:  # say what the pause before the summary is
            bar.line(sync.report().closing)
    report = sync.report()
    if report.ranks_may_fail and report.models_drift:  # gossip with a deadline
        out.accuracy = evaluate(s.model, s.data, comm, local=True)
        bar.line(f"closed: this rank's own model; test accuracy {out.accuracy:.4f}")
    elif report.ranks_may_fail:  # close() drained: every live rank holds the final state
        out.accuracy = evaluate(s.model, s.data, comm, local=True)
        bar.line(
            f"closed: every live rank holds global step {report.global_step}; "
            f"test accuracy {out.accuracy:.4f}"
        )
    else:
        comm.barrier()
    trace_path = merge_rank_traces(opts.trace, comm)
    phases = Phases.of(sync.stats, out.wall_s, comm, average=not report.ranks_may_fail)
    if comm.rank == 0:
        rows = summary_rows(opts, comm, out, phases, report, trace_path)
        print(render_summary(rows, one_rank=report.ranks_may_fail))
    if not (report.missing_ranks and comm.backend.one_death_ends_all):
        comm.close()  # (MPI's communicator free would wait on the dead rank)
    return 0


# --------------------------------------------------------------- summary


@dataclass(frozen=True)
class Phases:
    """Mean seconds per step by phase, bytes sent per step, and the run's wall time."""

    step_s: float
    backward_s: float
    pack_s: float
    comm_s: float
    unpack_s: float
    exposed_s: float
    bytes_sent: float
    wall_s: float

    @classmethod
    def of(cls, stats, wall_s: float, comm, average: bool) -> "Phases":
        """This rank's means, averaged over ranks when ``average`` (collective then)."""
        m = stats.mean()
        means = [m.step_s, m.backward_s, m.pack_s, m.comm_s, m.unpack_s, m.exposed_s]
        t = torch.tensor(means + [m.bytes_sent, wall_s], dtype=torch.float64, device=comm.device)
        if average:
            commrt.all_reduce(t, comm, op="avg")
        return cls(*t.cpu().tolist())
