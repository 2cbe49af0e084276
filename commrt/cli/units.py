"""Sizes and counts on the command line and in tables (binary units: 1 KiB = 1024 B)."""

from __future__ import annotations

import argparse
import os
import re
import tempfile

import torch

from commrt.sim import fmt_bytes  # noqa: F401  (re-exported: tables and tools format sizes alike)

#: dtype names the flags take
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_size(text: str) -> int:
    """'64K', '1M', '16MB', '1GiB', '4096' -> bytes (K, M, G are powers of two)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)i?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 64K, 1M, 16MB")
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)])


def size_list(text: str) -> list[int]:
    """argparse type: comma-separated positive sizes."""
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError("sizes must be positive, e.g. 64K,256M")
    return sizes


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds above 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give seconds as a number, got {text!r}") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"give a finite number of seconds above 0, got {text}")
    return v


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


def positive_number(text: str) -> float:
    """argparse type: a finite number above 0 (a learning rate, a size in MB)."""
    return _finite(text, 0.0, inclusive=False)


def bucket_mb(text: str) -> float:
    """argparse type: a bucket cap in MB, as :class:`commrt.GradientSync` takes it."""
    from commrt.sync.config import bucket_mb_problem  # lazy: it imports torch

    v = positive_number(text)
    problem = bucket_mb_problem(v)
    if problem:
        raise argparse.ArgumentTypeError(f"{text} MB {problem}")
    return v


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


def output_file(text: str) -> str:
    """argparse type: a file the command can write, its folder made if missing; checked
    before the work starts (a long run must not end in a traceback for want of a
    writable folder)."""
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    _writable_folder(text, os.path.dirname(path), make=True)
    return text


def output_folder(text: str) -> str:
    """argparse type: a folder the command can make and write files in (checked, not
    made: argparse checks the default too, which a run without plots never uses)."""
    _writable_folder(text, os.path.abspath(os.path.expanduser(text)), make=False)
    return text
