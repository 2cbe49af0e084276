"""Library source holds no lab notes: nothing that tells of one machine, its load or a dated run.

A docstring says what a thing does and why it is built that way; a comment says why.
Measurements from particular runs live in docs/benchmarks.md, beside the command and commit
that produced them. This is a pure text scan of commrt/, algorithms/ and kernels/ (it imports
nothing of the project), so it also guards files that cannot be imported here (CUDA, MPI).
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path

from helpers.layout import ROOT, library_sources

# Each pattern is matched case-insensitively against the text with line breaks (and the
# indent and "#"/"#:" that start a continued comment) turned into single spaces, so a phrase
# wrapped across lines is still found. They name a machine, a load or a date, not a unit.
PATTERNS = {
    "on this machine": r"\bon this machine\b",
    "this 2-core ...": r"\bthis (2|two)[- ]core\b",
    "2-core machine": r"\b(2|two)[- ]core (dev |development |ci |shared )?(machine|box|host)\b",
    "dev machine": r"\b(dev|development) machine\b",
    "load average": r"\bload averages?\b",
    "a load of N": r"\bunder a load of \d",
    "measured on <a machine>": (
        r"\bmeasured on (this|that|our|my)\b"
        r"|\bmeasured on (an? |the )[\w/ -]{0,30}?\b(machine|box|laptop|runner|H100|A100)\b"
        r"|\bmeasured on \d+ (cores?|ranks?|hosts?|nodes?|GPUs?)\b"
    ),
    "a dated run": r"\b20[2-3]\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b",
    "stop <number>": r"\bstop \d+\b",
}
_COMPILED = [(name, re.compile(rx, re.IGNORECASE)) for name, rx in PATTERNS.items()]
_CONTINUATION = re.compile(r"^\s*(#:?\s*)?")


def scan(text: str) -> list[tuple[int, str, str]]:
    """(line, pattern name, matched text) for every lab note in ``text``, a source file."""
    starts, parts, at = [], [], 0
    for line in text.splitlines():
        part = _CONTINUATION.sub("", line, count=1)
        starts.append(at)
        parts.append(part)
        at += len(part) + 1
    flat = " ".join(parts)
    found = []
    for name, rx in _COMPILED:
        for m in rx.finditer(flat):
            line = bisect.bisect_right(starts, m.start())
            found.append((line, name, m.group(0)))
    return sorted(set(found))


def library_files() -> list[Path]:
    """Every .py file of the library packages (commrt/, algorithms/, kernels/)."""
    return sorted(path for _, path in library_sources())


def test_patterns_catch_lab_notes_and_spare_code():
    notes = [
        "measured on this 2-core machine, shared",
        "Runs on that machine (load average 8 to 12)",
        "# measured on an H100 (Triton 3.6), 15 us",
        "a run on 2026-03-14 found it",
        "fixed at stop 12 of the\n    # soak",
        "Measured on\n    2 cores with gloo",
        "seen under a load of 10 to 20",
        "every rank runs on this\nmachine",
    ]
    for text in notes:
        assert scan(text), text
    code = [
        "β is measured on full-size pieces",
        "ranks to start on this host (default 2)",
        "timeout in seconds (default 300)",
        "stop the watchdog before the stream",
        "version 2.1-3 of the format",
        "def stop(self, n: int = 2) -> None:",
    ]
    for text in code:
        assert not scan(text), text
    assert scan("a\nb\nc measured on this machine")[0][0] == 3


def test_library_source_has_no_lab_notes():
    files = library_files()
    assert len(files) > 20, f"found only {len(files)} library files under {ROOT}"
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {name}: {matched!r}"
        for path in files
        for line, name, matched in scan(path.read_text(encoding="utf-8"))
    ]
    assert not hits, (
        "lab notes in library source (say what and why; move measurements to "
        "docs/benchmarks.md with their commit):\n" + "\n".join(hits)
    )
