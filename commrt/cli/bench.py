"""All-reduce measurement shared by ``commrt bench allreduce`` and ``bench/``.

Definitions follow nccl-tests: ``algbw = bytes / time`` and, for
all-reduce, ``busbw = algbw * 2(p-1)/p``, the per-link rate a ring would
need, comparable across world sizes and with link bandwidth.

Every rank runs the same number of iterations (fixed by the message size,
never by timing), so ranks can never disagree on how many collectives to
run. Times are rank 0's, median of ``repeats`` runs of ``iters`` calls.
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

#: 8 B and 4 KiB (latency-bound: one small bucket, gossip, control traffic), then 64 KiB .. 64 MiB
DEFAULT_SIZES = (8, 1 << 12) + tuple(1 << k for k in range(16, 27, 2))


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
NATIVE_NAMES = {"mpi": "MPI_Allreduce", "gloo": "gloo allreduce", "nccl": "ncclAllReduce"}


def busbw_factor(world_size: int) -> float:
    return 2 * (world_size - 1) / world_size if world_size > 1 else 1.0


def iterations_for(nbytes: int, budget_bytes: float = 4e8) -> int:
    """Calls per timed run: enough to last ~0.1 s on a slow machine, 3..1000."""
    return int(min(1000, max(3, budget_bytes // max(nbytes, 1 << 14))))


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
    moved: list[int] = field(default_factory=list)   # bytes read + written per result (kernels)


def time_calls(comm, fn: Callable[[], object], iters: int, repeats: int = 3) -> float:
    """Seconds per call of ``fn`` (median over ``repeats`` barrier-aligned runs).

    On a GPU the device is synchronised before the clock stops: NCCL calls
    return once enqueued.
    """
    sync = torch.cuda.synchronize if comm.device.type == "cuda" else (lambda: None)
    fn()   # warm-up: plan compilation, scratch allocation, connections
    sync()
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def measure_allreduce(comm, sizes: Sequence[int] = DEFAULT_SIZES, algorithms: Sequence[str] = ("ring",),
                      dtype: torch.dtype = torch.float32, native: bool = True, repeats: int = 3,
                      iters: int | None = None, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Time ``commrt.all_reduce`` (sum) per algorithm and the native all-reduce per size."""
    algs = [resolve(a) for a in algorithms]
    esize = torch.empty((), dtype=dtype).element_size()
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // esize)
        x = torch.ones(count, dtype=dtype, device=comm.device)
        n_iter = iters or iterations_for(nbytes)
        row = Row(count * esize, count)
        for alg in algs:
            t = time_calls(comm, lambda: commrt.all_reduce(x, comm, algorithm=alg, op="sum"), n_iter, repeats)
            row.results.append(Result(alg.name, t))
        if native:
            t = time_calls(comm, lambda: comm.transport.native_all_reduce(x, "sum"), n_iter, repeats)
            row.results.append(Result(f"native ({NATIVE_NAMES[comm.backend.value]})", t))
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def table_header(names: Sequence[str], world_size: int, title: str) -> str:
    """The last name is the native all-reduce; a final column gives every other's time over its."""
    cols = "".join(f" | {n[:26]:>26}" for n in names)
    sub = "".join(f" | {'time(us)':>9} {'algbw':>7} {'busbw':>8}" for _ in names)
    factor = busbw_factor(world_size)
    return (f"# {title}\n# busbw = algbw x 2(p-1)/p = algbw x {factor:.3g}; GB/s. "
            f"x native: each algorithm's time over the native one's, in column order\n"
            f"#{'size':>10} {'count':>11}{cols} | x native\n#{'':>10} {'(elements)':>11}{sub} |")


def table_row(row: Row, world_size: int) -> str:
    cells = "".join(f" | {r.time_s * 1e6:9.1f} {r.algbw(row.nbytes):7.3f} {r.busbw(row.nbytes, world_size):8.3f}"
                    for r in row.results)
    *mine, native = row.results
    ratios = (" ".join(f"{r.time_s / native.time_s:.2f}" for r in mine)
              if mine and native.name.startswith("native") else "")
    return f" {fmt_bytes(row.nbytes):>10} {row.count:>11}{cells} | {ratios}"


def plot_rows(rows: Sequence[Row], world_size: int, path: str, title: str) -> str:
    """Write busbw vs message size, one line per algorithm, as a PNG."""
    series = {r.name: ([row.nbytes for row in rows], [row.results[i].busbw(row.nbytes, world_size) for row in rows])
              for i, r in enumerate(rows[0].results)}
    return line_plot(path, series, title=title, xlabel="message size (bytes)", ylabel="busbw (GB/s)")


# --------------------------------------------------------------------------
# kernels: pack / unpack against a plain copy and against cat + scale
# --------------------------------------------------------------------------

KERNEL_OPS = ("pack", "unpack", "copy", "cat+scale")


def gradient_like(nbytes: int, esize: int = 4, dtype=torch.float32, device="cpu") -> list[torch.Tensor]:
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


def measure_kernels(sizes: Sequence[int], wire: torch.dtype = torch.float32, device: str = "cpu",
                    repeats: int = 5) -> list[Row]:
    """GB/s (bytes read + written) of pack, unpack, copy and cat+scale per bucket size."""
    from commrt.kernels import pack, unpack

    def timed(fn) -> float:
        fn()
        best = []
        for _ in range(repeats):
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device != "cpu":
                torch.cuda.synchronize()
            best.append(time.perf_counter() - t0)
        return statistics.median(best)

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
            Result("pack", timed(lambda: pack(grads, bucket, scale=0.5))),
            Result("unpack", timed(lambda: unpack(bucket, grads, scale=0.5))),
            Result("copy", timed(lambda: dst.copy_(src))),
            Result("cat+scale", timed(lambda: torch.cat(grads, out=flat).mul_(0.5))),
        ]
        # bytes read + written: fp32 side n*4, wire side n*wsize (copy and cat+scale: fp32 both ways)
        row.moved = [n * (4 + wsize), n * (4 + wsize), n * 8, n * 8]
        rows.append(row)
    return rows


def kernel_table(rows: Sequence[Row], title: str) -> str:
    head = (f"# {title}\n# GB/s = (bytes read + bytes written) / time; copy = Tensor.copy_ of the same "
            f"elements (the limit)\n#{'size':>10} {'count':>11}"
            + "".join(f" | {n:>10}" for n in KERNEL_OPS) + " | pack/copy")
    lines = [head]
    for row in rows:
        gbs = [m / r.time_s / 1e9 for m, r in zip(row.moved, row.results)]
        lines.append(f" {fmt_bytes(row.nbytes):>10} {row.count:>11}" + "".join(f" | {g:10.2f}" for g in gbs)
                     + f" | {gbs[0] / gbs[2]:8.0%}")
    return "\n".join(lines)


def plot_kernels(rows: Sequence[Row], path: str, title: str) -> str:
    series = {name: ([r.nbytes for r in rows], [r.moved[i] / r.results[i].time_s / 1e9 for r in rows])
              for i, name in enumerate(KERNEL_OPS)}
    return line_plot(path, series, title=title, xlabel="bucket size (bytes of fp32 gradients)",
                     ylabel="GB/s (read + written)")
