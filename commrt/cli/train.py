"""``commrt train``: data-parallel training of a small model on a real dataset.

The dataset is scikit-learn's handwritten digits (1797 8×8 images, 10
classes), which ships inside the scikit-learn package: nothing is
downloaded. Each epoch every rank takes its slice of one global shuffle
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
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

import commrt
from commrt import sim
from commrt.algorithms import Algorithm, Gossip
from commrt.cli.launch import launched_at
from commrt.cli.traces import merge_rank_traces, save_rank_trace
from commrt.cli.train_output import (
    ProgressBar,
    caught_up_line,
    epoch_line,
    render_summary,
    step_line,
    summary_rows,
)
from commrt.runtime.environment import rejoining
from commrt.sync.backup import RejoinedTooLate
from commrt.sync.report import SyncReport
from commrt.training.recipe import BatchSizeSchedule

TEST_FRACTION = 0.2
#: digits samples in scikit-learn's copy, and how many of them are training data
DIGITS_SAMPLES = 1797
TRAIN_SAMPLES = DIGITS_SAMPLES - int(DIGITS_SAMPLES * TEST_FRACTION)


@dataclass
class Digits:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits(seed: int = 0) -> Digits:
    """The digits data as float tensors scaled to [0, 1], split 80/20 with a fixed seed."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError as e:  # pragma: no cover - a core dependency
        raise RuntimeError(
            "commrt train needs scikit-learn (its digits dataset ships inside it): "
            "pip install scikit-learn"
        ) from e
    d = sk_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = perm[:n_test], perm[n_test:]
    return Digits(x[train], y[train], x[test], y[test])


@dataclass(frozen=True)
class Stragglers:
    """Injected delays before each step: fixed seconds for chosen ranks, and a delay every
    rank draws each step from ``draw`` (a :mod:`commrt.sim` delay), seeded per (rank, step).

    Example::

        >>> Stragglers.parse("1:0.02").delay(1, 0)
        0.02
        >>> s = Stragglers.parse("pareto:0.01")      # mean 10 ms, Pareto shape 2
        >>> s.delay(0, 5) == s.delay(0, 5)           # the same draw every time
        True
    """

    fixed: tuple[tuple[int, float], ...] = ()
    draw: object = None
    seed: int = 0

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "Stragglers":
        """``RANK:SECONDS``, ``exp:MEAN``, ``pareto:MEAN[:SHAPE]`` or ``lognormal:MEAN[:SIGMA]``,
        comma-separated; at most one distribution. ValueError names the part and the value
        that is wrong (an unknown kind, a value that is not a finite number, ...)."""
        fixed, draw = [], None
        for part in text.split(","):
            kind, *vals = part.strip().split(":")
            names = _value_names(kind, vals)
            nums = [_value(kind, n, v) for n, v in zip(names, vals)]
            if kind in DELAY_KINDS:
                if draw is not None:
                    raise ValueError("give at most one distribution")
                draw = _distribution(kind, *nums)
            else:
                fixed.append((int(kind), nums[0]))
        return cls(tuple(fixed), draw, seed)

    def delay(self, rank: int, step: int) -> float:
        d = dict(self.fixed).get(rank, 0.0)
        if self.draw is not None:
            d += float(self.draw.sample(np.random.default_rng([self.seed, rank, step]), 1)[0])
        return d

    def __str__(self) -> str:
        parts = [f"rank {r}: {sec:g} s" for r, sec in self.fixed]
        return ", ".join(parts + ([f"every rank: {self.draw}"] if self.draw is not None else []))


#: the delay distributions --straggler takes, and the values each takes after its name
DELAY_KINDS = {"exp": ("MEAN",), "pareto": ("MEAN", "SHAPE"), "lognormal": ("MEAN", "SIGMA")}
_FORMS = "RANK:SECONDS, exp:MEAN, pareto:MEAN[:SHAPE] or lognormal:MEAN[:SIGMA]"


def _value_names(kind: str, vals: list[str]) -> tuple[str, ...]:
    """What each value after ``kind`` means (ValueError for an unknown kind or a wrong count)."""
    if kind in DELAY_KINDS:
        names = DELAY_KINDS[kind]
    elif kind.lstrip("-").isdigit():
        names = ("SECONDS",)
    else:
        raise ValueError(
            f"unknown kind {kind!r}: start with a rank number or one of "
            f"{', '.join(DELAY_KINDS)}; use {_FORMS}"
        )
    if not 1 <= len(vals) <= len(names):
        form = "RANK:SECONDS" if names == ("SECONDS",) else f"{kind}:MEAN"
        extra = f"[:{names[1]}]" if len(names) > 1 else ""
        raise ValueError(f"{kind}:{':'.join(vals)}: use {form}{extra}, e.g. 1:0.02 or pareto:0.01")
    return names


def _value(kind: str, name: str, text: str) -> float:
    """One value of a --straggler part: a finite number, >= 0, and in range for ``name``."""
    kind = kind if kind in DELAY_KINDS else f"rank {kind}"
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{kind}'s {name} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"{kind}'s {name} must be a finite number, got {text}")
    if name == "SIGMA" and v <= 0:
        raise ValueError(f"lognormal's SIGMA (the spread) must be above 0, got {text}")
    if v < 0:
        raise ValueError(f"{kind}'s {name} must be non-negative seconds, got {text}")
    if name == "SHAPE" and v <= 1:
        raise ValueError(f"pareto's shape must be above 1 (else the mean is infinite), got {text}")
    return v


def _distribution(kind: str, mean: float, *shape: float):
    if kind == "exp":
        return sim.Exponential.from_mean(mean)
    if kind == "pareto":
        return sim.Pareto.from_mean(mean, *shape)
    return sim.LogNormal.from_mean(mean, *shape)


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


def _shard(n: int, epoch: int, seed: int, rank: int, world: int, global_batch: int):
    """This rank's index batches for one epoch: slices of one global shuffle."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    local = global_batch // world
    steps = n // global_batch
    for s in range(steps):
        start = s * global_batch + rank * local
        yield perm[start : start + local]


def evaluate(model, data: Digits, comm, local: bool = False) -> float:
    """Accuracy on the test split, each rank scoring its share, summed over ranks
    (``local``: this rank scores all of it, with no collective)."""
    if local:
        with torch.no_grad():
            return (model(data.x_test).argmax(1) == data.y_test).float().mean().item()
    n = len(data.x_test)
    idx = torch.arange(comm.rank, n, comm.world_size, device=data.x_test.device)
    with torch.no_grad():
        pred = model(data.x_test[idx]).argmax(1)
    counts = torch.tensor(
        [(pred == data.y_test[idx]).sum().item(), len(idx)], dtype=torch.float64, device=comm.device
    )
    commrt.all_reduce(counts, comm, op="sum")
    return counts[0].item() / counts[1].item()


def _gossip_shard(data: Digits, seed: int, rank: int, world: int):
    """This rank's own disjoint 1/p of the training data as (x, y): equal sizes, one
    permutation from the seed."""
    n = len(data.x_train) // world
    perm = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(seed))
    mine = perm[rank * n : (rank + 1) * n].to(data.x_train.device)
    return data.x_train[mine].clone(), data.y_train[mine].clone()


# ----------------------------------------------------------------- options


@dataclass(frozen=True)
class TrainOptions:
    """``commrt train``'s flags, checked, with the objects they name
    (built by :func:`commrt.cli.train_args.check_train`)."""

    # -- where the ranks run
    backend: str
    timeout: float
    # -- what they train, and how
    algorithm: Algorithm
    epochs: int
    lr: float
    batch_schedule: BatchSizeSchedule
    label_smoothing: float
    #: wire dtype (None: the gradients' own)
    comm_dtype: torch.dtype | None
    bucket_mb: float
    seed: int
    # -- fault and delay injection
    straggler: Stragglers | None = None
    #: (rank, step) at which that rank kills itself (its replacement does not)
    kill: tuple[int, int] | None = None
    #: replacements the launcher may start for workers that died (backup workers, gloo)
    max_restarts: int = 0
    # -- output
    trace: str | None = None
    quiet: bool = False


# ----------------------------------------------------------- data, set-up


class Sharding:
    """Where a rank's batches come from each epoch: slices of one global shuffle, or,
    for gossip (GossipGraD), the rank's own shard, half of it swapped with a gossip
    peer every epoch (the data choice follows the algorithm the user asked for)."""

    def __init__(self, algorithm: Algorithm, data: Digits, comm, seed: int):
        self.data, self.comm, self.seed = data, comm, seed
        self.shuffle = None
        if isinstance(algorithm, Gossip):
            shard = _gossip_shard(data, seed, comm.rank, comm.world_size)
            self.shuffle = commrt.data.GossipShuffle(shard, comm, fraction=0.5, seed=seed)

    def steps(self, global_batch: int) -> int:
        """Steps one epoch of ``global_batch`` takes on each rank."""
        n, world = len(self.data.x_train), self.comm.world_size
        if self.shuffle is not None:
            return (n // world) // (global_batch // world)
        return n // global_batch

    def batches(self, epoch: int, global_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        comm = self.comm
        if self.shuffle is not None:
            return self.shuffle.batches(global_batch // comm.world_size, epoch, drop_last=True)
        d = self.data
        idxs = (
            i.to(comm.device)
            for i in _shard(
                len(d.x_train), epoch, self.seed, comm.rank, comm.world_size, global_batch
            )
        )
        return ((d.x_train[i], d.y_train[i]) for i in idxs)


@dataclass
class Setup:
    """One rank's training ingredients (built by :func:`set_up`)."""

    opts: TrainOptions
    comm: object
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
    sharding = Sharding(opts.algorithm, data, comm, opts.seed)
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
        comm_dtype=opts.comm_dtype,
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


def train(s: Setup, sync: commrt.GradientSync, bar: ProgressBar) -> Outcome:
    """Every epoch: its steps, then (models that drift) exact averaging, then evaluation.

    Each epoch ends with its line, the last one too (a family whose ranks stop at the
    planned global step may stop inside an epoch), so the last line shows the last
    evaluation."""
    opts, comm = s.opts, s.comm
    traits = sync.report()
    out = Outcome(startup_s=max(0.0, time.time() - launched_at()))
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
        if traits.models_drift:
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
        print(f"{e}; this replacement leaves", file=sys.stderr, flush=True)
        return None


def run(opts: TrainOptions) -> int:
    """One rank of ``commrt train`` (the CLI launches the ranks)."""
    comm = commrt.init(opts.backend, timeout=opts.timeout)
    s = set_up(opts, comm)
    bar = ProgressBar(s.total_steps, enabled=comm.rank == 0 and not opts.quiet)
    sync = open_sync(s)
    if sync is None:
        comm.close()
        return 0
    with sync:
        out = train(s, sync, bar)
        save_rank_trace(opts.trace, sync, comm.rank)
        if sync.report().closing:  # say what the pause before the summary is
            bar.line(sync.report().closing)
    report = sync.report()
    if report.ranks_may_fail:  # close() drained: every live rank holds the final state
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
    if not (report.missing_ranks and comm.backend.value == "mpi"):
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
