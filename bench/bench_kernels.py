"""Kernel throughput: pack / unpack vs a plain copy and vs cat + scale.

From the repository root, after ``pip install -e '.[dev]'``::

    pytest bench/bench_kernels.py --benchmark-only

Each benchmark moves one gradient bucket (1, 4, 16, 64, 100 MB, and on a GPU
also 1024 MB = 1 GiB; MB = 2**20 bytes) made of a list of gradient tensors,
in one of two layouts:

* ``resnet50`` (realistic): consecutive ResNet-50 parameter gradients in
  backward order, as DDP fills buckets (fc first), the last one cut to fit:
  2 tensors at 1 MB, 8 at 16 MB, 163 at 100 MB (conv weights, BN vectors);
* ``small`` (stress): layers of a narrow transformer (d=128: 16 K-65 K
  element weights and 128-512 element biases), 12 tensors at 1 MB, 212 at
  16 MB, 1324 at 100 MB: bound by per-tensor overhead.

Throughput is GB/s (1e9 bytes/s) of *bytes read + bytes written by the
operation's contract* (an fp32 -> fp32 pack of N elements: 8N bytes), from
the median time; ``extra_info`` and the summary also hold the best-round
figure (the machine this was written on is shared and noisy). Ops, per
layout and bucket size (the ``small`` layout runs pack, copy and cat_mul):

* ``pack``          fp32 grads -> fp32 bucket, scale 1/8     (8N bytes)
* ``pack_bf16``     fp32 grads -> bf16 bucket, scale 1/8     (6N bytes)
* ``unpack``        fp32 bucket -> fp32 grads, scale 1/8     (8N bytes)
* ``unpack_acc_bf16`` bf16 bucket -> fp32 grads, accumulate  (10N bytes)
* ``copy``          ``Tensor.copy_`` of one contiguous fp32 buffer of the
  same N elements (8N bytes): the bandwidth limit
* ``cat_mul``       ``torch.cat`` of the flattened grads into the bucket
  (``out=``), then ``bucket.mul_(1/8)``: the unfused way (8N contract bytes;
  it really moves 16N)

On CPU the kernels take the torch reference path (what ``impl="auto"`` picks
for CPU tensors), timed by pytest-benchmark. On CUDA they take the Triton
path (the first call compiles), and each round measures two things:

* the kernel's GPU time, with a cold cache: the op gets several buffer sets
  (inputs and outputs), as many as make at least :data:`L2_TIMES` times the
  GPU's L2 cache (``L2_cache_size``) together, capped by a share of the free
  memory, and the launches of a round rotate through them, so each launch
  reads data no earlier launch left in L2. The round is queued behind a
  ``torch.cuda._sleep`` long enough for the host to enqueue every launch
  before the GPU reaches them; two CUDA events around the launches then time
  the GPU running kernel after kernel, not the host's pace. A round where
  the GPU caught up with the host anyway is run again with a longer sleep.
  ``copy_`` of the same bytes is timed the same way, over as many sets;
* the host's µs per call, separately: ``time.perf_counter`` around the
  launches alone, on one buffer set (a training step repeats one bucket),
  while the GPU is still busy with the sleep, so no launch waits for the GPU
  and no synchronisation is counted.

The CUDA variant is skipped with a reason where there is no GPU (or where
TRITON_INTERPRET=1 makes Triton unusable on CUDA tensors); tools/gpu_check.py
reports the benchmark as not run when no CUDA case ran. Nothing here says
what a GPU measures until it has run on one.

After each op's benchmark, the op and a ``copy_`` of the same elements are
also timed alternately (best of several rounds each): other processes' load
then hits both alike, which makes that ratio the steadier one on a shared
machine.

At the end of the session the tables print: every op's GB/s per layout and
size with pack / copy, the paired op / copy ratios, and on CUDA the host µs
per call. (The speed goals:
CPU pack >= 80% of copy from 4 MB; GPU pack >= 90% of copy and faster than
cat_mul.)
"""

from __future__ import annotations

import math
import statistics
import time
import warnings

import pytest
import torch
from cuda_timing import (
    buffer_sets,
    calls_per_round,
    gbps,
    gpu_seconds,
    host_seconds,
    l2_and_free_bytes,
)

from commrt.kernels import _common, pack, unpack

MB = 1 << 20
SIZES_MB = [1, 4, 16, 64, 100]
#: the GPU adds a 1 GiB bucket: far past the L2 cache, the HBM figure
CUDA_SIZES_MB = SIZES_MB + [1024]
#: rounds per figure: CUDA events time a round precisely, so fewer are needed there
ROUNDS = {"cpu": 15, "cuda": 7}
SCALE = 1.0 / 8
OPS = ["pack", "pack_bf16", "unpack", "unpack_acc_bf16", "copy", "cat_mul"]
# bytes per element that each op must read + write
BYTES_PER_ELEM = {
    "pack": 8,
    "pack_bf16": 6,
    "unpack": 8,
    "unpack_acc_bf16": 10,
    "copy": 8,
    "cat_mul": 8,
}


def resnet50_shapes():
    """Parameter shapes of torchvision's ResNet-50 in forward order (161 tensors, 25 557 032 elements)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            out = width * 4
            shapes += [
                (width, inp, 1, 1),
                (width,),
                (width,),
                (width, width, 3, 3),
                (width,),
                (width,),
                (out, width, 1, 1),
                (out,),
                (out,),
            ]
            if b == 0:  # downsample conv + BN
                shapes += [(out, inp, 1, 1), (out,), (out,)]
            inp = out
    return shapes + [(1000, 2048), (1000,)]


def small_shapes():
    """One layer of a narrow transformer (d=128): qkv, out-proj, 2 norms, MLP."""
    d = 128
    return [(3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]


def bucket_shapes(layout: str, nbytes: int):
    """Shapes of exactly ``nbytes`` of fp32 gradients: the layout's tensors in
    backward order, repeated as needed, the last one cut to fit."""
    order = (resnet50_shapes() if layout == "resnet50" else small_shapes())[::-1]
    n, shapes, total, k = nbytes // 4, [], 0, 0
    while total < n:
        s = order[k % len(order)]
        m = math.prod(s)
        if total + m > n:
            s, m = (n - total,), n - total
        shapes.append(s)
        total += m
        k += 1
    return shapes


def cuda_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    backend = _common.triton_backend()
    if backend is None:
        return "triton is not installed"
    if backend.interpret_mode():
        return "TRITON_INTERPRET=1 is set: the Triton kernels cannot run on CUDA tensors"
    return None


_CUDA_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_skip_reason() is not None, reason=str(cuda_skip_reason())),
]
#: (device, bucket MB): the CPU rows, then the GPU rows with their 1 GiB bucket
DEVICE_SIZES = [pytest.param("cpu", mb, id=f"cpu-{mb}MB") for mb in SIZES_MB] + [
    pytest.param("cuda", mb, marks=_CUDA_MARKS, id=f"cuda-{mb}MB") for mb in CUDA_SIZES_MB
]

LAYOUT_OPS = [("resnet50", op) for op in OPS] + [
    ("small", op) for op in ("pack", "copy", "cat_mul")
]

_results = {}  # (device, layout, mb, op) -> (median GB/s, best GB/s)
_paired = {}  # (device, layout, mb, op) -> op GB/s / copy GB/s, timed alternately
_host_us = {}  # (layout, mb, op) -> host µs per call on CUDA, the GPU kept busy


def summary_line(cells, first: int = 15, width: int = 9) -> str:
    """One row of the summary tables: the first cell left-aligned in ``first`` characters,
    the rest right-aligned in ``width``, always a space apart (an op name of 15,
    "unpack_acc_bf16", ran into its neighbour without one). Six sizes fit 80 columns."""
    head, *rest = cells
    return " ".join([f"{head:<{first}}", *(f"{c:>{width}}" for c in rest)]).rstrip()


def _gbs_rows(dev: str, layout: str) -> list[list[str]]:
    """One row per op (then pack/copy), one column per size: median GB/s (the best round's
    is in --benchmark-json, extra_info gbps_best)."""
    sizes = [mb for mb in CUDA_SIZES_MB if any((dev, layout, mb, op) in _results for op in OPS)]
    rows = [["op"] + [f"{mb} MB" for mb in sizes]]
    for op in OPS:
        if any((dev, layout, mb, op) in _results for mb in sizes):
            cells = [_results.get((dev, layout, mb, op)) for mb in sizes]
            rows.append([op] + [f"{r[0]:.1f}" if r else "-" for r in cells])
    ratio = ["pack/copy"]
    for mb in sizes:
        p, c = _results.get((dev, layout, mb, "pack")), _results.get((dev, layout, mb, "copy"))
        ratio.append(f"{p[0] / c[0]:.0%}" if p and c else "-")
    return rows + [ratio]


def _paired_rows(dev: str, layout: str) -> list[list[str]]:
    """One row per op (copy aside), one column per size: op GB/s over copy GB/s."""
    sizes = [mb for mb in CUDA_SIZES_MB if any((dev, layout, mb, op) in _paired for op in OPS)]
    rows = [["op"] + [f"{mb} MB" for mb in sizes]]
    for op in OPS:
        if op != "copy" and any((dev, layout, mb, op) in _paired for mb in sizes):
            cells = [_paired.get((dev, layout, mb, op)) for mb in sizes]
            rows.append([op] + [f"{r:.0%}" if r is not None else "-" for r in cells])
    return rows


def host_rows(host_us: dict, layout: str) -> list[list[str]]:
    """One row per op, one column per size: host µs per call (``host_us``: (layout, MB,
    op) -> µs), "-" where an op did not run at a size."""
    sizes = sorted({mb for lay, mb, _ in host_us if lay == layout})
    rows = [["op"] + [f"{mb} MB" for mb in sizes]]
    for op in OPS:
        if any((layout, mb, op) in host_us for mb in sizes):
            cells = [host_us.get((layout, mb, op)) for mb in sizes]
            rows.append([op] + [f"{us:.1f}" if us is not None else "-" for us in cells])
    return rows


class _Summary:
    """Prints the GB/s tables at the end of the session (registered by the fixture below):
    per device and layout, an op per row and a size per column, within 80 columns."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _results:
            return
        tr = terminalreporter
        tr.section("kernel GB/s (bytes read + written), median; best: --benchmark-json")
        keys = sorted({k[:2] for k in _results})
        for dev, layout in keys:
            tr.write_line(f"{dev} · {layout}")
            for row in _gbs_rows(dev, layout):
                tr.write_line(summary_line(row))
        if _host_us:
            tr.section("host µs per call on CUDA, the GPU kept busy (one buffer set)")
            for layout in sorted({k[0] for k in _host_us}):
                tr.write_line(f"cuda · {layout}")
                for row in host_rows(_host_us, layout):
                    tr.write_line(summary_line(row))
        if not _paired:
            return
        tr.section("op GB/s / copy GB/s, paired: best round, alternating with copy_")
        tr.write_line(
            "Trust these ratios over pack/copy above: op and copy_ run in turn, so load\n"
            "on the machine slows both alike; above, each op was timed on its own, at\n"
            "another moment."
        )
        for dev, layout in sorted({k[:2] for k in _paired}):
            tr.write_line(f"{dev} · {layout}")
            for row in _paired_rows(dev, layout):
                tr.write_line(summary_line(row))


@pytest.fixture(scope="module", autouse=True)
def _summary_table(request):
    plugin = _Summary()
    request.config.pluginmanager.register(plugin, "commrt-bench-kernels-summary")
    yield


def _round_seconds(fns, reps: int, device: str, host_s: float = 0.0) -> float:
    """Seconds per call of ``reps`` calls back to back, rotating through ``fns`` (one per
    buffer set): on CUDA the GPU's, between two events (see cuda_timing.py; ``host_s``,
    the host's time per call, sizes the sleep in front), on the CPU the clock's."""
    if device == "cuda":
        seconds, host_bound = gpu_seconds(fns, reps, host_s)
        if host_bound:  # said where the summary shows it, not hidden in a figure
            pace = f"{seconds * 1e6:.1f} µs per call is the host's pace"
            warnings.warn(f"the GPU caught up with the host behind every sleep: {pace}",
                          stacklevel=2)  # fmt: skip
        return seconds
    t0 = time.perf_counter()
    for i in range(reps):
        fns[i % len(fns)]()
    return (time.perf_counter() - t0) / reps


def _timed_rounds(sets, reps: int, device: str, host_s: float = 0.0):
    """Best time per call of each op (a list of functions, one per buffer set), timing
    them alternately round by round; ``host_s`` as for :func:`_round_seconds` (the
    slowest op's: a longer sleep than needed costs nothing but time)."""
    best = [float("inf")] * len(sets)
    for _ in range(ROUNDS[device]):
        for k, fns in enumerate(sets):
            best[k] = min(best[k], _round_seconds(fns, reps, device, host_s))
    return best


def _sets(layout: str, op: str, device: str, mb: int, count: int | None = None):
    """(elements, a function per buffer set): one set on the CPU; on CUDA ``count``, else
    as many as exceed the L2 cache :data:`cuda_timing.L2_TIMES` times over."""
    n, fn = _make(layout, op, device, mb)
    if count is None:
        count = 1
        if device == "cuda":
            torch.cuda.empty_cache()  # the sets of the case before are free memory again
            count = buffer_sets(*l2_and_free_bytes(), BYTES_PER_ELEM[op] * n)
    return n, [fn] + [_make(layout, op, device, mb)[1] for _ in range(count - 1)]


def _make(layout: str, op: str, device: str, mb: int):
    """Inputs for one op on one bucket; returns (elements, function to time)."""
    shapes = bucket_shapes(layout, mb * MB)
    # drawn where they live: a 1 GiB bucket drawn on the CPU and copied over would take
    # longer than timing it
    gen = torch.Generator(device=device).manual_seed(mb)
    grads = [torch.randn(s, generator=gen, device=device) for s in shapes]
    n = sum(g.numel() for g in grads)
    impl = "torch" if device == "cpu" else "triton"
    if op == "pack":
        bucket = torch.empty(n, device=device)
        return n, lambda: pack(grads, bucket, SCALE, impl=impl)
    if op == "pack_bf16":
        bucket = torch.empty(n, device=device, dtype=torch.bfloat16)
        return n, lambda: pack(grads, bucket, SCALE, impl=impl)
    if op == "unpack":
        bucket = torch.randn(n, generator=gen, device=device)
        return n, lambda: unpack(bucket, grads, SCALE, impl=impl)
    if op == "unpack_acc_bf16":
        bucket = torch.randn(n, generator=gen, device=device).to(torch.bfloat16)
        return n, lambda: unpack(bucket, grads, SCALE, accumulate=True, impl=impl)
    if op == "copy":
        src = torch.randn(n, generator=gen, device=device)
        dst = torch.empty(n, device=device)
        return n, lambda: dst.copy_(src)
    if op == "cat_mul":
        bucket = torch.empty(n, device=device)
        return n, lambda: torch.cat([g.view(-1) for g in grads], out=bucket).mul_(SCALE)
    raise ValueError(op)


# Order: all ops of one (device, size) run back to back (the top decorator
# varies fastest), so ops compared in one table row see similar machine load.
@pytest.mark.parametrize("layout,op", LAYOUT_OPS, ids=[f"{lay}-{op}" for lay, op in LAYOUT_OPS])
@pytest.mark.parametrize("device,mb", DEVICE_SIZES)
def test_kernel_throughput(benchmark, layout, op, mb, device):
    n, fns = _sets(layout, op, device, mb)
    fn, nbytes = fns[0], BYTES_PER_ELEM[op] * n
    benchmark.group = f"{device} {layout} {mb:>3} MB"
    benchmark.extra_info.update(
        op=op, layout=layout, device=device, bucket_mb=mb, elements=n, bytes_moved=nbytes
    )
    gpu_s = []  # CUDA: seconds per launch of each round, from CUDA events
    host_s = 0.0  # CUDA: host seconds per call, the GPU kept busy
    if device == "cuda":
        # rounds of launches rotating through the buffer sets, queued behind a sleep
        reps = calls_per_round(len(fns), nbytes)
        for f in fns:
            f()  # the first call compiles; each set builds its tables
        torch.cuda.synchronize()
        host_s = host_seconds(fn)
        _host_us[(layout, mb, op)] = host_s * 1e6

        def run():
            gpu_s.append(_round_seconds(fns, reps, device, host_s))

        benchmark.pedantic(run, rounds=ROUNDS[device], warmup_rounds=1, iterations=1)
    else:
        reps = 1
        fn()
        benchmark(fn)
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable: timed nothing
        return
    timed = gpu_s[-ROUNDS[device] :]
    med = statistics.median(timed) if gpu_s else stats.stats.median / reps
    best = min(timed) if gpu_s else stats.stats.min / reps
    rate = gbps(nbytes, med)
    benchmark.extra_info.update(
        launches_per_round=reps,
        buffer_sets=len(fns),
        gbps_median=round(rate, 2),
        gbps_best=round(gbps(nbytes, best), 2),
    )
    if device == "cuda":
        benchmark.extra_info["host_us_per_call"] = round(host_s * 1e6, 2)
    _results[(device, layout, mb, op)] = (rate, gbps(nbytes, best))
    if op != "copy":
        # the same comparison with both timed alternately: other processes'
        # load then hits the op and the copy alike
        _, copies = _sets(layout, "copy", device, mb, count=len(fns))
        t_op, t_copy = _timed_rounds([fns, copies], reps, device, host_s)
        ratio = (nbytes / t_op) / (BYTES_PER_ELEM["copy"] * n / t_copy)
        benchmark.extra_info["vs_copy_paired"] = round(ratio, 3)
        _paired[(device, layout, mb, op)] = ratio
