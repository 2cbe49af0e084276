"""One command for the day a GPU is lent: every GPU test and the kernel benchmark, one table.

Run on the GPU machine, from the repository root, after
``python3 -m pip install --no-deps -e .``::

    python tools/gpu_check.py            # about 5-10 minutes on one H100
    python tools/gpu_check.py --quick    # tests and one bucket size only

It runs, each in a child process with ``TRITON_INTERPRET`` removed and a
time limit (a hung child is killed and reported as such):

1. the tests marked ``gpu`` in tests/gpu/test_gpu.py and tests/gpu/test_kernels_gpu.py
   (plus the sm_90 code-generation check), one row per test: passed,
   failed (first line of the error), skipped (the reason) or killed;
2. ``bench/bench_kernels.py --benchmark-only`` (its own tables go to
   ``gpu_check_bench.txt``), one row: passed or failed;
3. pack, unpack (fp32 and bf16 wire) and the receive-reduce at 1 to 64 MB
   buckets, in GB/s (bytes read + written) against ``Tensor.copy_`` of
   the same elements (the HBM limit), one row per size.

The table is at most 80 columns wide. Without a GPU it still runs: the
tests report their skip reasons and the kernel rows say there is no GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH = 80
TESTS = ["tests/gpu/test_gpu.py", "tests/gpu/test_kernels_gpu.py"]
MB = 1 << 20


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    return env


def _cut(text: str, n: int, squash: bool = True) -> str:
    text = " ".join(str(text).split()) if squash else str(text).rstrip()
    return text if len(text) <= n else text[: n - 1] + "…"


def row(name: str, result: str, detail: str = "") -> str:
    """One line of the table: name (34), result (9), detail (the rest), within 80 columns."""
    line = f"{_cut(name, 34):<34} {_cut(result, 9):<9} {_cut(detail, WIDTH)}"
    return _cut(line, WIDTH, squash=False)


def run_tests(timeout: float, out_dir: str) -> list[str]:
    xml = os.path.join(out_dir, "gpu_check_tests.xml")
    cmd = [sys.executable, "-m", "pytest", *TESTS, "-q", "-rA", f"--junitxml={xml}"]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return [row("GPU tests", "killed", f"still running after {timeout:g} s")]
    if not os.path.exists(xml):
        return [row("GPU tests", "error", (proc.stdout + proc.stderr)[-60:])]
    return test_rows(ET.parse(xml).getroot())


def test_rows(root) -> list[str]:
    """One row per test case of a junit XML tree."""
    rows = []
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        secs = f"{float(case.get('time', 0)):.1f} s"
        failed = case.find("failure")
        if failed is None:
            failed = case.find("error")
        skipped = case.find("skipped")
        if failed is not None:
            rows.append(row(name, "FAILED", failed.get("message", "")))
        elif skipped is not None:
            rows.append(row(name, "skipped", skipped.get("message", "")))
        else:
            rows.append(row(name, "passed", secs))
    return rows


def run_bench(timeout: float, out_dir: str) -> list[str]:
    log = os.path.join(out_dir, "gpu_check_bench.txt")
    cmd = [sys.executable, "-m", "pytest", "bench/bench_kernels.py", "--benchmark-only", "-q"]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return [row("bench_kernels.py", "killed", f"after {timeout:g} s")]
    with open(log, "w") as f:
        f.write(proc.stdout + proc.stderr)
    result = "passed" if proc.returncode == 0 else "FAILED"
    return [row("bench_kernels.py", result, f"tables in {os.path.basename(log)}")]


def kernel_rows(sizes_mb, timeout: float) -> list[str]:
    """GB/s rows from a child process (it imports Triton without TRITON_INTERPRET)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--kernels", *map(str, sizes_mb)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return [row("kernel GB/s", "killed", f"after {timeout:g} s")]
    if proc.returncode != 0:
        return [row("kernel GB/s", "FAILED", (proc.stdout + proc.stderr).strip()[-40:])]
    return [_cut(line, WIDTH, squash=False) for line in proc.stdout.splitlines() if line.strip()]


def measure(sizes_mb) -> None:
    """(In the child.) Print GB/s of pack/unpack per wire dtype and of the receive-reduce,
    each against ``Tensor.copy_`` of the same elements, per bucket size."""
    import torch

    if not torch.cuda.is_available():
        print(row("kernel GB/s", "skipped", "no CUDA GPU on this machine"))
        return
    from commrt.cli.bench import measure_kernels
    from commrt.kernels import reduce_

    print(f"{'bucket':>7} {'wire':>5} {'pack':>7} {'unpack':>7} {'copy':>7} GB/s {'pack/copy':>9}")
    for wire, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for r in measure_kernels([mb * MB for mb in sizes_mb], wire=wire, device="cuda"):
            gbs = [m / x.time_s / 1e9 for m, x in zip(r.moved, r.results)]
            size = f"{r.nbytes // MB} MB"
            print(f"{size:>7} {name:>5} {gbs[0]:7.0f} {gbs[1]:7.0f} {gbs[2]:7.0f}      "
                  f"{gbs[0] / gbs[2]:9.0%}")  # fmt: skip
    for mb in sizes_mb:
        n = mb * MB // 4
        dst, src = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        half = src.to(torch.bfloat16)
        t_red = _timed(lambda: reduce_(dst, half))  # noqa: B023
        t_copy = _timed(lambda: dst.copy_(src))  # noqa: B023
        red, copy = n * (4 + 2 + 4) / t_red / 1e9, n * 8 / t_copy / 1e9
        print(f"{mb:>4} MB reduce fp32 += bf16 {red:7.0f} GB/s, copy {copy:7.0f} GB/s, "
              f"{red / copy:4.0%}")  # fmt: skip


def _timed(fn, repeats: int = 20) -> float:
    import statistics

    import torch

    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tests and one bucket size only")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per part")
    ap.add_argument("--out", default=".", help="folder for the logs")
    ap.add_argument("--kernels", type=int, nargs="+", help=argparse.SUPPRESS)  # the child
    a = ap.parse_args(argv)
    if a.kernels:
        measure(a.kernels)
        return 0
    start = time.monotonic()
    lines = ["=" * WIDTH, row("commrt GPU check", "result", "detail"), "-" * WIDTH]
    lines += run_tests(a.timeout, a.out)
    if not a.quick:
        lines += run_bench(a.timeout, a.out)
    lines.append("-" * WIDTH)
    lines += kernel_rows([16] if a.quick else [1, 4, 16, 64], a.timeout)
    lines.append("-" * WIDTH)
    lines.append(row("total", f"{time.monotonic() - start:.0f} s"))
    print("\n".join(lines))
    return 1 if any(" FAILED " in f" {ln} " or " killed " in ln for ln in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
