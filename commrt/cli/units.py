"""Sizes and counts on the command line and in tables (binary units: 1 KiB = 1024 B)."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import re
import sys
import tempfile

from commrt.cli.extras import installed
from commrt.process.rendezvous import MAX_TIMEOUT_S, check_timeout
from commrt.sim import fmt_bytes  # noqa: F401  (re-exported: tables and tools format sizes alike)

#: dtype names the flags take, each with torch's name for it (:func:`torch_dtype`: no torch
#: imported to build the parser, so that --help answers at once)
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float64": "float64",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
#: for the help of a flag that takes them (with a metavar: the choices themselves ran the
#: usage line past 80 columns)
DTYPE_NAMES = ", ".join(DTYPES)


def torch_dtype(name: str):
    """The torch dtype a flag's dtype name (:data:`DTYPES`) stands for."""
    import torch

    return getattr(torch, DTYPES[name])


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU. Told without importing torch where it is not imported
    yet (the launcher of ``commrt train`` imports none: each rank imports it once, and two
    imports of a CUDA build were seconds of its start-up): torch is a CUDA build (its
    ``version.py`` names a CUDA version) and the CUDA driver counts a device, as
    ``torch.cuda.is_available()`` asks the driver."""
    if "torch" in sys.modules:
        return sys.modules["torch"].cuda.is_available()
    return _torch_cuda_version() is not None and _driver_devices() > 0


def _torch_cuda_version() -> str | None:
    """The CUDA version torch was built for, read from its ``version.py`` (None: a CPU or
    ROCm build, or no torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(path) as f:
            m = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def _driver_devices() -> int:
    """The CUDA devices the driver counts for this process (CUDA_VISIBLE_DEVICES applied by
    the driver itself); 0 without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def named(name: str):
    """Decorator: the name argparse shows for an argparse type that raised ValueError or
    TypeError ("invalid positive integer value: 'abc'"); it shows ``__name__``, which
    would leak ours ("invalid positive_int value")."""

    def rename(fn):
        fn.__name__ = name
        return fn

    return rename


@named("size")
def parse_size(text: str) -> int:
    """'64K', '1M', '16MB', '1GiB', '4096' -> bytes (K, M, G are powers of two)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)i?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 64K, 1M, 16MB")
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)])


@named("list of sizes")
def size_list(text: str) -> list[int]:
    """argparse type: comma-separated positive sizes."""
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError("sizes must be positive, e.g. 64K,256M")
    return sizes


@named("positive integer")
def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    v = whole_number(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def whole_number(text: str) -> int:
    """``text`` as an int; ArgumentTypeError saying so if it is not one."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a whole number, got {text!r}") from None


@named("timeout")
def timeout_seconds(text: str) -> float:
    """argparse type: seconds above 0 and at most MAX_TIMEOUT_S, as commrt.init takes them
    (checked here, before the launch, so a bad one does not fail in every rank after it)."""
    try:
        return check_timeout(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"give seconds above 0, at most {MAX_TIMEOUT_S:g} (about 3 years), got {text}"
        ) from None


def _finite(text: str, low: float, inclusive: bool) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a number, got {text!r}") from None
    if not ((v >= low) if inclusive else (v > low)) or v == float("inf") or v != v:
        raise argparse.ArgumentTypeError(
            f"give a finite number {'of 0 or more' if inclusive else 'above 0'}, got {text}"
        )
    return v


@named("positive number")
def positive_number(text: str) -> float:
    """argparse type: a finite number above 0 (a learning rate, a size in MB)."""
    return _finite(text, 0.0, inclusive=False)


@named("bucket size")
def bucket_mb(text: str) -> float:
    """argparse type: a bucket cap in MB, as :class:`commrt.GradientSync` takes it."""
    from commrt.sync.config import bucket_mb_problem  # lazy: it imports torch

    v = positive_number(text)
    problem = bucket_mb_problem(v)
    if problem:
        raise argparse.ArgumentTypeError(f"{text} MB {problem}")
    return v


@named("number")
def non_negative_number(text: str) -> float:
    """argparse type: a finite number, 0 or more (milliseconds of compute or delay)."""
    return _finite(text, 0.0, inclusive=True)


def _writable_folder(text: str, folder: str, make: bool) -> None:
    """Check that a new file can be made in ``folder`` (``make``: making it first if it is
    missing; else in its nearest existing folder, where the command will make it);
    ArgumentTypeError saying why not."""
    try:
        if make:
            os.makedirs(folder, exist_ok=True)
        else:
            while not os.path.lexists(folder):
                folder = os.path.dirname(folder)
            if not os.path.isdir(folder):
                raise NotADirectoryError(folder)
    except (FileExistsError, NotADirectoryError):
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: a file is in the way of the folder {folder}"
        ) from None
    except OSError as e:
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: cannot make the folder {folder} ({e.strerror or e})"
        ) from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: {folder} takes no new file ({e.strerror or e})"
        ) from None


@named("file name")
def output_file(text: str) -> str:
    """argparse type: a file the command can write, its folder made if missing; checked
    before the work starts (a long run must not end in a traceback for want of a
    writable folder)."""
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    _writable_folder(text, os.path.dirname(path), make=True)
    return text


@named("folder name")
def output_folder(text: str) -> str:
    """argparse type: a folder the command can make and write files in (checked, not
    made: argparse checks the default too, which a run without plots never uses)."""
    _writable_folder(text, os.path.abspath(os.path.expanduser(text)), make=False)
    return text


@named("plot file")
def plot_file(text: str) -> str:
    """argparse type: an :func:`output_file` in a format matplotlib writes, told by its
    extension; checked before the work (a benchmark ran to its end, then failed to save
    a .txt plot). Without matplotlib the format goes unchecked: the command then says
    that --plot needs it (:mod:`commrt.cli.extras`)."""
    if not installed("matplotlib"):
        return output_file(text)
    from commrt.cli.plotting import formats  # lazy: matplotlib takes half a second

    ext = os.path.splitext(text)[1][1:].lower()
    if ext not in formats():
        kinds = ", ".join(f".{f}" for f in formats())
        why = f"matplotlib cannot write .{ext} files" if ext else "no extension to tell the format"
        raise argparse.ArgumentTypeError(f"cannot plot to {text}: {why}; give one of {kinds}")
    return output_file(text)


@named("device")
def kernel_device(text: str) -> str:
    """argparse type: cpu, cuda or cuda:N (torch's error for any other was a traceback)."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"give cpu or cuda (or cuda:N), got {text!r}")
    return text


@named("grid shape")
def grid_shape(text: str) -> tuple[int, int]:
    """argparse type: ROWSxCOLS, like 2x2, as (rows, cols), each at least 1."""
    m = re.fullmatch(r"\s*(\d+)\s*[x×]\s*(\d+)\s*", text.lower())
    if not m or min(int(m[1]), int(m[2])) < 1:
        raise argparse.ArgumentTypeError(
            f"give ROWSxCOLS, like 2x2 (rows and columns at least 1), got {text!r}"
        )
    return int(m[1]), int(m[2])
