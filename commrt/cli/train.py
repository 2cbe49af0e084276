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
share) and ends with a summary table.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

import commrt
from commrt import sim
from commrt.algorithms import Gossip, resolve

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
    except ImportError as e:   # pragma: no cover - a core dependency
        raise RuntimeError("commrt train needs scikit-learn (its digits dataset ships inside it): "
                           "pip install scikit-learn") from e
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
        comma-separated; at most one distribution."""
        fixed, draw = [], None
        for part in text.split(","):
            kind, *vals = part.strip().split(":")
            try:
                nums = [float(v) for v in vals]
            except ValueError:
                raise ValueError(f"{part!r} has a value that is not a number") from None
            if any(v < 0 for v in nums) or not nums:
                raise ValueError(f"{part!r}: give non-negative seconds, e.g. 1:0.02 or pareto:0.01")
            if kind in ("exp", "pareto", "lognormal"):
                if draw is not None:
                    raise ValueError("give at most one distribution")
                draw = _distribution(kind, *nums)
            elif kind.isdigit() and len(nums) == 1:
                fixed.append((int(kind), nums[0]))
            else:
                raise ValueError(f"{part!r}: use RANK:SECONDS, exp:MEAN, pareto:MEAN[:SHAPE] or "
                                 f"lognormal:MEAN[:SIGMA]")
        return cls(tuple(fixed), draw, seed)

    def delay(self, rank: int, step: int) -> float:
        d = dict(self.fixed).get(rank, 0.0)
        if self.draw is not None:
            d += float(self.draw.sample(np.random.default_rng([self.seed, rank, step]), 1)[0])
        return d

    def __str__(self) -> str:
        parts = [f"rank {r}: {sec:g} s" for r, sec in self.fixed]
        return ", ".join(parts + ([f"every rank: {self.draw}"] if self.draw is not None else []))


def _distribution(kind: str, mean: float, *shape: float):
    if len(shape) > 1:
        raise ValueError(f"{kind} takes MEAN and at most one shape value")
    if kind == "exp":
        if shape:
            raise ValueError("exp takes only MEAN")
        return sim.Exponential(mean)
    if kind == "pareto":
        a = shape[0] if shape else 2.0
        if a <= 1:
            raise ValueError(f"pareto shape must be above 1 for a finite mean, got {a:g}")
        return sim.Pareto(mean * (a - 1), a)          # mean = scale / (shape - 1)
    sigma = shape[0] if shape else 1.0
    return sim.LogNormal(mean / float(np.exp(sigma ** 2 / 2)), sigma)   # mean = median·e^(σ²/2)


def make_model(seed: int, hidden: int = 256) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


class Progress:
    """Progress for rank 0: a tqdm bar on a terminal, one plain line per epoch otherwise.

    On a terminal the bar is one line, redrawn in place and cut to the
    terminal's width (read again on every update, so resizing works), so
    nothing wraps.
    Piped output (mpiexec, a log file, CI) gets no carriage returns: just
    the line of each finished epoch.
    """

    def __init__(self, total: int, enabled: bool, stream=None):
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.bar = None
        if enabled and self.stream.isatty():
            from tqdm import tqdm
            # the width is ours to read (see _columns): tqdm's dynamic_ncols hides the bar
            # altogether on a terminal that reports 0 lines (script(1), some CI runners)
            self.bar = tqdm(total=total, file=self.stream, ncols=self._columns() - 1, nrows=24, leave=True,
                            mininterval=0.2, unit="step", bar_format="{n_fmt}/{total_fmt} {bar} {desc}")

    def _columns(self) -> int:
        try:
            cols = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            cols = 0
        return cols if cols > 0 else 80

    def update(self, n: int, text: str, epoch_end: bool = False) -> None:
        if self.bar is not None:
            self.bar.ncols = self._columns() - 1   # never the last column: some terminals wrap there
            self.bar.set_description_str(text, refresh=False)
            self.bar.update(n)
            if epoch_end:
                self.bar.refresh()
        elif self.enabled and epoch_end:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _shard(n: int, epoch: int, seed: int, rank: int, world: int, global_batch: int):
    """This rank's index batches for one epoch: slices of one global shuffle."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    local = global_batch // world
    steps = n // global_batch
    for s in range(steps):
        start = s * global_batch + rank * local
        yield perm[start:start + local]


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
    counts = torch.tensor([(pred == data.y_test[idx]).sum().item(), len(idx)], dtype=torch.float64,
                          device=comm.device)
    commrt.all_reduce(counts, comm, op="sum")
    return counts[0].item() / counts[1].item()


def _gossip_shard(data: Digits, seed: int, rank: int, world: int):
    """This rank's own disjoint 1/p of the training data as (x, y): equal sizes, one
    permutation from the seed."""
    n = len(data.x_train) // world
    perm = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(seed))
    mine = perm[rank * n:(rank + 1) * n].to(data.x_train.device)
    return data.x_train[mine].clone(), data.y_train[mine].clone()


def run(args) -> int:
    """One rank of ``commrt train`` (the CLI launches the ranks)."""
    comm = commrt.init(args.backend, timeout=args.timeout)
    rank, world = comm.rank, comm.world_size
    data = load_digits(args.seed)
    if comm.device.type != "cpu":   # nccl: model and data live on this rank's GPU
        data = Digits(*(t.to(comm.device) for t in (data.x_train, data.y_train, data.x_test, data.y_test)))
    model = make_model(args.seed).to(comm.device)
    algorithm = resolve(args.algorithm)
    batch_schedule = args.batch_schedule_obj
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    straggle = args.straggler
    # backup workers: ranks run at their own pace and may die, so nothing may wait on all of them
    backup = getattr(algorithm, "backups", None) is not None
    step_no = 0
    n = len(data.x_train)
    gossip = isinstance(algorithm, Gossip)
    total_steps = sum((n // world) // (batch_schedule.batch_size(e) // world) if gossip
                      else n // batch_schedule.batch_size(e) for e in range(args.epochs))
    bar = Progress(total_steps, enabled=rank == 0 and not args.quiet)
    trace_dir = None
    if args.trace:
        trace_dir = os.path.splitext(args.trace)[0] + ".ranks"
    t_start = time.perf_counter()
    samples = 0
    acc = 0.0
    # gossip (GossipGraD): each rank trains on its own shard, swapping half of it with a gossip
    # peer every epoch; the models drift apart and are averaged exactly before each evaluation
    shuffle = (commrt.data.GossipShuffle(_gossip_shard(data, args.seed, rank, world), comm,
                                         fraction=0.5, seed=args.seed) if gossip else None)
    disagreements = []
    with commrt.GradientSync(model, comm, algorithm=algorithm, bucket_mb=args.bucket_mb,
                             first_bucket_mb=min(1.0, args.bucket_mb), comm_dtype=args.comm_dtype_obj,
                             trace=bool(args.trace)) as sync:
        for epoch in range(args.epochs):
            gb = batch_schedule.batch_size(epoch)
            if gb % world:
                raise ValueError(f"global batch {gb} at epoch {epoch} does not split over {world} ranks")
            for group in opt.param_groups:
                group["lr"] = batch_schedule.lr(epoch, args.lr)
            t_epoch = time.perf_counter()
            losses = []
            steps = 0
            if gossip:
                batches = shuffle.batches(gb // world, epoch, drop_last=True)
            else:
                idxs = (i.to(comm.device) for i in _shard(n, epoch, args.seed, rank, world, gb))
                batches = ((data.x_train[i], data.y_train[i]) for i in idxs)
            for xb, yb in batches:
                if args.kill and args.kill == (rank, step_no):
                    os.kill(os.getpid(), signal.SIGKILL)
                if straggle:
                    time.sleep(straggle.delay(rank, step_no))
                step_no += 1
                loss = loss_fn(model(xb), yb)
                loss.backward()
                applied = sync.step(opt)
                losses.append(loss.item())
                steps += 1
                samples += gb
                last = sync.stats.last
                comm_share = last.exposed_s / max(last.step_s, 1e-9)
                rate = samples / (time.perf_counter() - t_start)
                # backup workers: the bar counts global steps (a late rank catches up several)
                bar.update(applied if backup else 1,
                           f"epoch {epoch + 1}/{args.epochs} loss {loss.item():.3f} acc {acc:.3f} "
                           f"{rate:,.0f} samples/s comm {comm_share:.0%}")
                if backup and (sync.policy.finished or sync.global_step >= total_steps):
                    break         # training ended, or this rank holds the planned global steps
            if gossip:
                disagreements.append(commrt.average_parameters(model, comm, opt))
            acc = evaluate(model, data, comm, local=backup)
            if backup and (sync.policy.finished or sync.global_step >= total_steps):
                break
            epoch_rate = steps * gb / max(time.perf_counter() - t_epoch, 1e-9)
            apart = f" apart {disagreements[-1]:.1e}" if gossip else ""
            bar.update(0, f"epoch {epoch + 1}/{args.epochs} loss {sum(losses) / max(1, len(losses)):.3f} "
                          f"acc {acc:.3f}{apart} {epoch_rate:,.0f} samples/s batch {gb}",
                       epoch_end=True)
        bar.close()
        wall = time.perf_counter() - t_start
        stats = sync.stats
        trace_path = None
        if args.trace:
            os.makedirs(trace_dir, exist_ok=True)
            sync.save_trace(os.path.join(trace_dir, f"rank{rank}.json"))
    report = sync.policy.report() if backup else None
    if backup:   # close() drained: every live rank holds the final state and wrote its trace
        acc = evaluate(model, data, comm, local=True)
    else:
        comm.barrier()
    if args.trace and rank == 0:
        from commrt.trace import merge_traces
        paths = [os.path.join(trace_dir, f"rank{r}.json") for r in range(world)]
        trace_path = merge_traces([p for p in paths if os.path.exists(p)], args.trace)
    m = stats.mean()
    phases = torch.tensor([m.step_s, m.backward_s, m.pack_s, m.comm_s, m.unpack_s, m.exposed_s,
                           m.bytes_sent, wall], dtype=torch.float64, device=comm.device)
    if not backup:
        commrt.all_reduce(phases, comm, op="avg")
    phases = phases.cpu()
    if rank == 0:
        print(summary_table(args, comm, acc, samples, phases.tolist(), stats, trace_path,
                            batch_schedule, report, disagreements))
    if not (backup and report.missing and comm.backend.value == "mpi"):
        comm.close()   # (MPI's communicator free would wait on the dead rank)
    return 0


def _algorithm_row(asked: str, labels) -> str:
    """What was asked for and what each bucket ran, once when they are the same (the summary
    must fit an 80-column terminal)."""
    chosen = ", ".join(dict.fromkeys(labels))
    ran = asked if chosen == asked else f"{asked} → {chosen}"
    return f"{ran} ({len(labels)} buckets)"


def summary_table(args, comm, acc, samples, phases, stats, trace_path, batch_schedule,
                  report=None, disagreements=()) -> str:
    step_s, backward_s, pack_s, comm_s, unpack_s, exposed_s, bytes_sent, wall = phases
    compute_s = max(0.0, step_s - exposed_s)
    ms = lambda x: f"{x * 1e3:9.3f} ms"   # noqa: E731
    share = lambda x: f"{x / step_s:6.1%}" if step_s > 0 else "   n/a"   # noqa: E731
    rows = [
        ("final test accuracy", f"{acc:.4f}"),
        ("wall time", f"{wall:.2f} s"),
        ("throughput", f"{samples / wall:,.0f} samples/s"),
        ("ranks × backend", f"{comm.world_size} × {comm.backend.value}"),
        ("algorithm", _algorithm_row(str(args.algorithm), stats.algorithms)),
        ("wire dtype", str(args.comm_dtype_obj or torch.float32).replace("torch.", "")),
        ("batch schedule", str(batch_schedule)),
        ("label smoothing", f"{args.label_smoothing:g}"),
        ("time per step", ms(step_s)),
        ("  compute (fwd+bwd+opt)", f"{ms(compute_s)} {share(compute_s)}"),
        ("  pack", f"{ms(pack_s)} {share(pack_s)}"),
        ("  communication", f"{ms(comm_s)} {share(comm_s)}"),
        ("  unpack", f"{ms(unpack_s)} {share(unpack_s)}"),
        ("  exposed (blocked in wait)", f"{ms(exposed_s)} {share(exposed_s)}"),
        ("bytes sent per step", f"{bytes_sent / 1e3:,.1f} KB per rank"),
        ("trace", trace_path or "off (use --trace out.json)"),
    ]
    if args.straggler:
        rows.insert(8, ("stragglers", str(args.straggler)))
    if report is not None:
        n = report.world_size - report.backups
        rows[8:8] = [
            ("backup workers", f"first {n} of {report.world_size} gradients per step "
                               f"(b = {report.backups})"),
            ("global steps", f"{report.global_step}"),
            ("dropped gradients",
             ", ".join(f"r{r} {d}" for r, d in sorted(report.dropped.items()))),
            ("missing ranks", ", ".join(map(str, report.missing)) or "none"),
        ]
    if disagreements:   # gossip: how far apart the models were when averaged each epoch
        rows.insert(5, ("disagreement (‖θ_r−θ̄‖/‖θ̄‖)",
                        f"{disagreements[-1]:.2e} last epoch, {max(disagreements):.2e} max"))
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 44)
    body = "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)
    who = "rank 0's view" if report is not None else "averaged over ranks"
    return f"{line}\ncommrt train summary (means over steps, {who})\n{line}\n{body}\n{line}"
