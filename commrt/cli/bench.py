"""All-reduce measurement shared by ``commrt bench allreduce`` and ``bench/``.

Definitions follow nccl-tests: ``algbw = bytes / time`` and, for
all-reduce, ``busbw = algbw * 2(p-1)/p``, the per-link rate a ring would
need, comparable across world sizes and with link bandwidth.

Every rank runs the same number of iterations (fixed by the message size,
never by timing), so ranks can never disagree on how many collectives to
run. Times are rank 0's, median of ``repeats`` runs of ``iters`` calls.

Every table has a real anchor: what a user would otherwise run on the same ranks
(:func:`anchors`): gloo's all-reduce always, and ``MPI_Allreduce`` where mpi4py is
installed and the ranks were started by mpiexec (``commrt bench allreduce`` starts them so
where it can). Over shm and cuda_ipc the transport's own "native" all-reduce is the tests'
oracle (every rank sums every rank's tensor in rank order), not a tuned all-reduce: it is
no anchor and is not timed here.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

import commrt
from commrt.algorithms import resolve
from commrt.cli.plotting import line_plot
from commrt.cli.units import fmt_bytes
from commrt.runtime.choice import Backend

#: 8 B and 4 KiB (latency-bound: one small bucket, gossip, control traffic), then 64 KiB,
#: 1 MiB and 16 MiB: the default ``commrt bench allreduce`` sweep, seconds on 2 shared cores
DEFAULT_SIZES = (8, 1 << 12) + tuple(1 << k for k in range(16, 25, 4))
#: bytes a default timed run moves, and at most this many calls (:func:`default_iterations`)
DEFAULT_BUDGET_BYTES = 16e6
DEFAULT_MAX_ITERS = 50


class DelayBackward(torch.autograd.Function):
    """Identity whose backward sleeps ``seconds``: emulated accelerator compute.

    On a GPU, backward kernels leave the CPU (and the network) free for
    communication; a sleep does the same on a CPU-only machine, so overlap
    can be studied here. ``DelayBackward.apply(x, 0.01)``.
    """

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


#: the anchors' rows, as :func:`anchors` names them (each the engine's own all-reduce, as
#: its backend's row names it: :attr:`commrt.runtime.choice.Row.native`); the ratio
#: column is over gloo's
GLOO_ANCHOR, MPI_ANCHOR = (Backend(name).row.native for name in ("gloo", "mpi"))
#: the algorithm column of the table: the longest "native (...)" whole, in 80 columns
NAME_W = 29


def busbw_factor(world_size: int) -> float:
    return 2 * (world_size - 1) / world_size if world_size > 1 else 1.0


def iterations_for(nbytes: int, budget_bytes: float = 4e8, most: int = 1000) -> int:
    """Calls per timed run: enough to last ~0.1 s on a slow machine, 3..``most``."""
    return int(min(most, max(3, budget_bytes // max(nbytes, 1 << 14))))


def timing_buffer(count: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """The tensor a timed loop all-reduces in place, ``count`` zeros.

    Zeros because a sum repeated in place must stay finite: ones double per
    call at p=2 and reach inf after 128 calls, and numpy's overflow warning
    then lands in the middle of the table.
    """
    return torch.zeros(count, dtype=dtype, device=device)


def default_iterations(nbytes: int) -> int:
    """Calls per timed run of ``commrt bench allreduce`` without --iters: 3..50, ~16 MB."""
    return iterations_for(nbytes, DEFAULT_BUDGET_BYTES, DEFAULT_MAX_ITERS)


@dataclass
class Result:
    name: str
    time_s: float

    def algbw(self, nbytes: int) -> float:
        return nbytes / self.time_s / 1e9

    def busbw(self, nbytes: int, world_size: int) -> float:
        return self.algbw(nbytes) * busbw_factor(world_size)


@dataclass
class Row:
    nbytes: int
    count: int
    results: list[Result] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)  # bytes read + written per result (kernels)


def time_calls(comm, fn: Callable[[], object], iters: int, repeats: int = 3) -> float:
    """Seconds per call of ``fn`` (median over ``repeats`` barrier-aligned runs, after a
    warm-up call): :func:`time_alternated` of one."""
    return time_alternated(comm, [fn], iters, repeats)[0]


def time_alternated(
    comm, fns: Sequence[Callable[[], object]], iters: int, repeats: int = 3
) -> list[float]:
    """Seconds per call of each of ``fns``, in alternated rounds: each warmed up once
    (plan compilation, scratch, connections), then ``repeats`` rounds in which each runs
    ``iters`` calls after a barrier, every other round in reverse order, so that a slow
    stretch of the machine meets all of them alike rather than one's runs back to back;
    each figure is the median of its rounds. On a GPU the device is synchronised before
    the clock stops (NCCL calls return once enqueued)."""
    sync = torch.cuda.synchronize if comm.device.type == "cuda" else (lambda: None)
    for fn in fns:
        fn()
        sync()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for i in range(len(fns)) if r % 2 == 0 else reversed(range(len(fns))):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fns[i]()
            sync()
            times[i].append((time.perf_counter() - t0) / iters)
    return [statistics.median(t) for t in times]


def anchors(comm, dtype: torch.dtype = torch.float32) -> tuple[list[tuple[str, Callable]], list]:
    """What a user would otherwise run on ``comm``'s ranks: ``[(row name, all_reduce(t))]``,
    gloo's all-reduce first, then ``MPI_Allreduce`` where mpi4py is installed and the ranks
    are mpiexec's (and the dtype is one MPI reduces); and the communicators opened for them,
    for the caller to close (collective: every rank, same call)."""
    import os

    own = comm.backend.row.native  # the engine's own all-reduce: an anchor already?
    out, opened = [], []
    if own == GLOO_ANCHOR:
        out.append((f"native ({GLOO_ANCHOR})", comm.transport.native_all_reduce))
    else:
        # its own rendezvous port: rank 0 already serves the job's store on MASTER_PORT, and
        # a second store there is refused (EADDRINUSE, seen with torch 2.15)
        port = os.environ.get("MASTER_PORT")
        gloo = commrt.init(
            "gloo", timeout=comm.timeout, master_port=int(port) + 1 if port else None
        )
        opened.append(gloo)
        out.append((GLOO_ANCHOR, gloo.transport.native_all_reduce))
    if dtype not in (torch.float32, torch.float64) or comm.device.type != "cpu":
        return out, opened
    if own == MPI_ANCHOR:
        out.append((f"native ({MPI_ANCHOR})", comm.transport.native_all_reduce))
    elif "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        try:
            from mpi4py import MPI
        except ImportError:
            return out, opened
        world = MPI.COMM_WORLD
        if world.Get_size() == comm.world_size:
            out.append((MPI_ANCHOR, lambda t: world.Allreduce(MPI.IN_PLACE, t.numpy(), MPI.SUM)))
    return out, opened


def measure_allreduce(
    comm,
    sizes: Sequence[int] = DEFAULT_SIZES,
    algorithms: Sequence[str] = ("ring",),
    dtype: torch.dtype = torch.float32,
    native: bool = True,
    repeats: int = 3,
    iters: int | None = None,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Time ``commrt.all_reduce`` (sum) per algorithm, and with ``native`` the anchors per
    size (:func:`anchors`), all of a size in alternated rounds (:func:`time_alternated`)."""
    algs = [resolve(a) for a in algorithms]
    esize = torch.empty((), dtype=dtype).element_size()
    rows = []
    engines, opened = anchors(comm, dtype) if native else ([], [])
    try:
        _measure(comm, sizes, algs, engines, dtype, repeats, iters, on_row, rows, esize)
    finally:
        for c in opened:
            c.close()
    return rows


def _measure(comm, sizes, algs, engines, dtype, repeats, iters, on_row, rows, esize) -> None:
    """:func:`measure_allreduce`'s sweep: per size, every algorithm and anchor, into
    ``rows`` (kept by the caller, which closes the anchors' communicators however it ends)."""
    for nbytes in sizes:
        count = max(1, nbytes // esize)
        x = timing_buffer(count, dtype, comm.device)
        n_iter = iters or default_iterations(nbytes)
        row = Row(count * esize, count)
        fns = [
            lambda x=x, alg=alg: commrt.all_reduce(x, comm, algorithm=alg, op="sum") for alg in algs
        ]
        fns += [lambda x=x, run=run: run(x) for _, run in engines]
        names = [alg.name for alg in algs] + [name for name, _ in engines]
        for name, t in zip(names, time_alternated(comm, fns, n_iter, repeats)):
            row.results.append(Result(name, t))
        rows.append(row)
        if on_row is not None:
            on_row(row)


def table_header(names: Sequence[str], world_size: int, title: str) -> str:
    """One line per algorithm and size (fits 80 columns); the anchors' rows come last."""
    factor = busbw_factor(world_size)
    return (
        f"# {title}\n# busbw = algbw × 2(p-1)/p = algbw × {factor:.3g}; × gloo: time over "
        f"gloo's all-reduce's\n#{'size':>8} {'algorithm':<{NAME_W}}{'time µs':>10}"
        f"{'algbw GB/s':>11}{'busbw GB/s':>11}{'× gloo':>9}"
    )


def _anchor(row: Row, name: str = GLOO_ANCHOR) -> Result | None:
    """The row's result of the anchor ``name`` (its own or, as the transport's native one,
    ``native (name)``), or None."""
    return next((r for r in row.results if r.name in (name, f"native ({name})")), None)


def table_row(row: Row, world_size: int) -> str:
    """The lines of one size: one per algorithm, the size on the first."""
    native = _anchor(row)
    lines = []
    for i, r in enumerate(row.results):
        size = fmt_bytes(row.nbytes) if i == 0 else ""
        ratio = f"{r.time_s / native.time_s:.2f}" if native is not None and r is not native else ""
        lines.append(
            f" {size:>8} {r.name[:NAME_W]:<{NAME_W}}{r.time_s * 1e6:10.1f}{r.algbw(row.nbytes):11.3f}"
            f"{r.busbw(row.nbytes, world_size):11.3f}{ratio:>9}".rstrip()
        )
    return "\n".join(lines)


def records(rows: Sequence[Row], world_size: int) -> list[dict]:
    """Every measured point with all its columns, for --csv and --json."""
    out = []
    for row in rows:
        gloo, mpi = _anchor(row), _anchor(row, MPI_ANCHOR)
        for r in row.results:
            out.append(
                {
                    "bytes": row.nbytes,
                    "count": row.count,
                    "algorithm": r.name,
                    "time_us": r.time_s * 1e6,
                    "algbw_GBps": r.algbw(row.nbytes),
                    "busbw_GBps": r.busbw(row.nbytes, world_size),
                    "x_gloo": r.time_s / gloo.time_s if gloo is not None else None,
                    "x_mpi": r.time_s / mpi.time_s if mpi is not None else None,
                }
            )
    return out


def write_records(recs: Sequence[dict], csv_path: str | None, json_path: str | None) -> list[str]:
    """Write ``recs`` as CSV and/or JSON; the paths written."""
    import csv
    import json

    done = []
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(recs[0]) if recs else [])
            w.writeheader()
            w.writerows(recs)
        done.append(csv_path)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(list(recs), f, indent=1)
        done.append(json_path)
    return done


def plot_rows(rows: Sequence[Row], world_size: int, path: str, title: str) -> str:
    """Write busbw vs message size, one line per algorithm, as a PNG."""
    series = {
        r.name: (
            [row.nbytes for row in rows],
            [row.results[i].busbw(row.nbytes, world_size) for row in rows],
        )
        for i, r in enumerate(rows[0].results)
    }
    return line_plot(
        path, series, title=title, xlabel="message size (bytes)", ylabel="busbw (GB/s)"
    )


# --------------------------------------------------------------------------
# kernels: pack / unpack against a plain copy and against cat + scale
# --------------------------------------------------------------------------

KERNEL_OPS = ("pack", "unpack", "copy", "cat+scale")


def gradient_like(
    nbytes: int, esize: int = 4, dtype=torch.float32, device="cpu"
) -> list[torch.Tensor]:
    """A bucket of gradient-shaped tensors: square-ish weights with their biases."""
    out, left = [], nbytes // esize
    width = 1024
    while left > 0:
        w = min(left, width * width)
        out.append(torch.randn(w, dtype=dtype, device=device))
        left -= w
        b = min(left, width)
        if b:
            out.append(torch.randn(b, dtype=dtype, device=device))
            left -= b
    return out


def seconds_per_call(
    fn: Callable[[], object], device: str = "cpu", rounds: int = 5, round_s: float = 0.02
) -> float:
    """Seconds one call of ``fn`` takes: the median over ``rounds`` of a round of many calls
    made back to back, divided by the calls.

    On CUDA the calls of a round are queued with no synchronisation between them and timed
    by two CUDA events around them, so the GPU runs kernel after kernel and the figure is
    the kernels' (the host's launch cost shows only where it exceeds a kernel's run time).
    Timing each call alone between two synchronisations would measure launch and Python
    time on buckets of a few MB instead. On the CPU a round is timed by the clock. A round
    makes as many calls as fit in about ``round_s`` (1 to 1000); the first call, before any
    round, compiles and builds tables.
    """
    cuda = device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    calls = max(1, min(1000, int(round_s / max(time.perf_counter() - t0, 1e-7))))
    times = []
    for _ in range(rounds):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def measure_kernels(
    sizes: Sequence[int], wire: torch.dtype = torch.float32, device: str = "cpu", repeats: int = 5
) -> list[Row]:
    """GB/s (bytes read + written) of pack, unpack, copy and cat+scale per bucket size, each
    timed over many back-to-back calls (:func:`seconds_per_call`), median of ``repeats``."""
    from commrt.kernels import pack, unpack

    def timed(fn) -> float:
        return seconds_per_call(fn, device, repeats)

    rows = []
    wsize = torch.empty((), dtype=wire).element_size()
    for nbytes in sizes:
        grads = gradient_like(nbytes, device=device)
        n = sum(g.numel() for g in grads)
        bucket = torch.empty(n, dtype=wire, device=device)
        src = torch.randn(n, device=device)
        dst = torch.empty(n, device=device)
        flat = torch.empty(n, device=device)
        row = Row(n * 4, n)
        row.results = [
            # each lambda runs inside timed() before the loop moves on
            Result("pack", timed(lambda: pack(grads, bucket, scale=0.5))),  # noqa: B023
            Result("unpack", timed(lambda: unpack(bucket, grads, scale=0.5))),  # noqa: B023
            Result("copy", timed(lambda: dst.copy_(src))),  # noqa: B023
            Result("cat+scale", timed(lambda: torch.cat(grads, out=flat).mul_(0.5))),  # noqa: B023
        ]
        # bytes read + written: fp32 side n*4, wire side n*wsize (copy and cat+scale: fp32 both ways)
        row.moved = [n * (4 + wsize), n * (4 + wsize), n * 8, n * 8]
        rows.append(row)
    return rows


def kernel_table(rows: Sequence[Row], title: str) -> str:
    head = (
        f"# {title}\n# GB/s = (bytes read + written) / time; copy = Tensor.copy_ of the same\n"
        f"# elements (the limit); pack/copy = pack's GB/s over copy's\n"
        f"#{'size':>8}" + "".join(f"{n + ' GB/s':>15}" for n in KERNEL_OPS) + f"{'pack/copy':>10}"
    )
    lines = [head]
    for row in rows:
        gbs = [m / r.time_s / 1e9 for m, r in zip(row.moved, row.results)]
        lines.append(
            f" {fmt_bytes(row.nbytes):>8}"
            + "".join(f"{g:15.2f}" for g in gbs)
            + f"{gbs[0] / gbs[2]:10.0%}"
        )
    return "\n".join(lines)


def kernel_records(rows: Sequence[Row]) -> list[dict]:
    """Every kernel point with its count, bytes moved and time, for --csv and --json."""
    return [
        {
            "bytes": row.nbytes,
            "count": row.count,
            "op": r.name,
            "moved_bytes": m,
            "time_us": r.time_s * 1e6,
            "GBps": m / r.time_s / 1e9,
        }
        for row in rows
        for m, r in zip(row.moved, row.results)
    ]


def plot_kernels(rows: Sequence[Row], path: str, title: str) -> str:
    series = {
        name: ([r.nbytes for r in rows], [r.moved[i] / r.results[i].time_s / 1e9 for r in rows])
        for i, name in enumerate(KERNEL_OPS)
    }
    return line_plot(
        path,
        series,
        title=title,
        xlabel="bucket size (bytes of fp32 gradients)",
        ylabel="GB/s (read + written)",
    )
