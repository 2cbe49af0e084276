"""What ``commrt train`` shows: rank 0's progress and the summary table.

Rendering only: :mod:`commrt.cli.train` computes the numbers (an
``Outcome``, ``Phases`` and the sync's :class:`~commrt.sync.report.SyncReport`)
and hands them here to be drawn. Everything fits an 80-column terminal.
"""

from __future__ import annotations

import os
import sys

from commrt.cli.units import fmt_bytes
from commrt.sync.report import SyncReport


class ProgressBar:
    """Rank 0's progress: a tqdm bar on a terminal, one plain line per epoch otherwise.

    On a terminal the bar is one line, redrawn in place and cut to the
    terminal's width (read again on every update, so resizing works), so
    nothing wraps; each finished epoch's line is written above it and stays.
    Piped output (mpiexec, a log file, CI) gets no carriage returns: just
    the line of each finished epoch, and the notes; so does a terminal
    without tqdm (an optional dependency: the ``train`` extra).
    """

    def __init__(self, total: int, enabled: bool, stream=None):
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.bar = None
        if enabled and self.stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # plain epoch lines, as when piped
                return
            # the width is ours to read (see _columns): tqdm's dynamic_ncols hides the bar
            # altogether on a terminal that reports 0 lines (script(1), some CI runners)
            self.bar = tqdm(
                total=total,
                file=self.stream,
                ncols=self._columns() - 1,
                nrows=24,
                leave=True,
                mininterval=0.2,
                unit="step",
                bar_format="{n_fmt}/{total_fmt} {bar} {desc}",
            )

    def _columns(self) -> int:
        try:
            cols = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            cols = 0
        return cols if cols > 0 else 80

    def update(self, n: int, text: str) -> None:
        """``n`` more steps done; ``text`` describes the latest (the bar's tail)."""
        if self.bar is not None:
            # never the last column: some terminals wrap there
            self.bar.ncols = self._columns() - 1
            self.bar.set_description_str(text, refresh=False)
            self.bar.update(n)

    def line(self, text: str) -> None:
        """A line that stays (an epoch's result, a note), above the bar on a terminal.

        The bar keeps its own description, so its width does not jump when a
        longer epoch line comes and goes."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        elif self.enabled:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def step_line(epoch: int, epochs: int, loss: float, rate: float, exposed: float) -> str:
    """The bar's tail: ``exposed``, the last step's share blocked in wait (the summary's
    "exposed (blocked in wait)", per step). No accuracy: that is the epoch lines' (an
    evaluation's), and a bar that carried the previous one disagreed with them."""
    return f"epoch {epoch + 1}/{epochs} loss {loss:.3f} {rate:,.0f} samples/s exposed {exposed:.0%}"


def epoch_line(
    epoch: int,
    epochs: int,
    losses: list[float],
    acc: float,
    disagreements: list[float],
    rate: float,
    global_batch: int,
) -> str:
    apart = f" apart {disagreements[-1]:.1e}" if disagreements else ""
    return (
        f"epoch {epoch + 1}/{epochs} loss {sum(losses) / max(1, len(losses)):.3f} "
        f"acc {acc:.3f}{apart} {rate:,.0f} samples/s batch {global_batch}"
    )


def caught_up_line(done: int, epochs: int, global_step: int, acc: float) -> str:
    """The last epoch's line on a rank that ran only ``done`` epochs of its own: where
    ranks run at their own pace (backup workers) the others' steps may finish the job
    while a late rank is epochs behind, and it ends holding their final state (caught
    up by snapshot)."""
    return (
        f"epoch {epochs}/{epochs} finished by the others (this rank ran {done}): "
        f"global step {global_step}, acc {acc:.3f}"
    )


def _algorithm_row(asked: str, labels) -> str:
    """What was asked for and what each bucket ran, once when they are the same (the summary
    must fit an 80-column terminal)."""
    chosen = ", ".join(dict.fromkeys(labels))
    ran = asked if chosen == asked else f"{asked} → {chosen}"
    return f"{ran} ({len(labels)} buckets)"


def _ranks_row(comm) -> str:
    """How many ranks ran over which backend; one rank ran in this process, exchanging
    nothing, whatever backend was set up."""
    if comm.world_size == 1:
        return "1 rank, in this process (nothing to exchange)"
    return f"{comm.world_size} × {comm.backend.value}"


def summary_rows(
    opts, comm, out, ph, report: SyncReport, trace_path: str | None
) -> list[tuple[str, str]]:
    """The summary table's (label, value) rows, in order: ``opts``, ``out`` and ``ph`` are
    :mod:`commrt.cli.train`'s ``TrainOptions``, ``Outcome`` and ``Phases``."""
    compute_s = max(0.0, ph.step_s - ph.exposed_s)
    ms = lambda x: f"{x * 1e3:9.3f} ms"  # noqa: E731
    share = lambda x: f"{x / ph.step_s:6.1%}" if ph.step_s > 0 else "   n/a"  # noqa: E731
    rows = [
        ("final test accuracy", f"{out.accuracy:.4f}"),
        ("start-up", f"{out.startup_s:.2f} s (launch to first step)"),
        *((f"  {name}", f"{seconds:.2f} s") for name, seconds in out.startup_phases),
        ("training", f"{ph.wall_s:.2f} s (steps and evaluations)"),
        ("throughput", f"{out.samples / ph.wall_s:,.0f} samples/s"),
        ("ranks × backend", _ranks_row(comm)),
        ("algorithm", _algorithm_row(str(opts.algorithm), report.algorithms)),
    ]
    if out.disagreements:  # how far apart the models were when averaged each epoch
        d = out.disagreements
        rows.append(("disagreement (‖θ_r−θ̄‖/‖θ̄‖)", f"{d[-1]:.2e} last epoch, {max(d):.2e} max"))
    rows += [
        ("wire dtype", opts.comm_dtype or "float32"),
        ("batch schedule", str(opts.batch_schedule)),
        ("label smoothing", f"{opts.label_smoothing:g}"),
        *report.rows,
    ]
    if opts.straggler:
        rows.append(("stragglers", str(opts.straggler)))
    # the step's two parts add up to it; the traffic runs beside it on the progress thread
    # (its shares of the step would add up to more than the step)
    busy_s = ph.pack_s + ph.comm_s + ph.unpack_s
    return rows + [
        ("time per step", ms(ph.step_s)),
        ("  compute (fwd+bwd+opt)", f"{ms(compute_s)} {share(compute_s)}"),
        ("  exposed (blocked in wait)", f"{ms(ph.exposed_s)} {share(ph.exposed_s)}"),
        ("traffic, beside the step", ms(busy_s)),
        ("  pack", ms(ph.pack_s)),
        ("  communication", ms(ph.comm_s)),
        ("  unpack", ms(ph.unpack_s)),
        ("bytes sent per step", f"{fmt_bytes(ph.bytes_sent)} per rank"),
        ("trace", trace_path or "off (use --trace out/trace.json)"),
    ]


def render_summary(rows: list[tuple[str, str]], one_rank: bool = False) -> str:
    """The summary table's text (``one_rank``: the numbers are rank 0's alone)."""
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 44)
    body = "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)
    who = "rank 0's view" if one_rank else "averaged over ranks"
    return f"{line}\ncommrt train summary (means over steps, {who})\n{line}\n{body}\n{line}"
