"""The docs pages read as a product's pages, not a lab notebook.

No page of docs/ and no README names an issue, a load average, a dated run or a
retired script, or tells the order the work went: a page says what is and how
to run it; history lives in commit messages. Every script a page names
(``bench/…``, ``tools/…``, ``tests/…``) exists. A pure text scan: it imports
nothing of the project.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: what a lab notebook says and a product's page does not, each matched case-insensitively
#: against the page with its line breaks turned into spaces (a phrase wrapped still shows)
NOTEBOOK = {
    "an issue": r"\bissues? #?\d+",
    "a load average": r"\bload averages?\b|\b(at|under) (a )?load( of)? \d|\bload \d+(\.\d+)?\s*[–-]",
    "a dated run": r"\b20[2-3]\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b",
    "a retired script": r"\bretired\b",
    "the work's history": r"\border the work went\b|\bnotes moved\b|\bused to take\b",
}
_COMPILED = [(name, re.compile(rx, re.IGNORECASE)) for name, rx in NOTEBOOK.items()]
#: a script a page names, by its path in the repository
SCRIPT = re.compile(r"\b((?:bench|tools|tests)/[\w/]+\.py)\b")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def notebook_lines(text: str) -> list[tuple[str, str]]:
    """(what, the text matched) for every lab note in ``text``."""
    flat = " ".join(text.split())
    return [(name, m.group(0)) for name, rx in _COMPILED for m in rx.finditer(flat)]


def test_the_scan_finds_lab_notes_and_spares_a_product_page():
    notes = [
        "### Small-message latency under DDP (issue 42)",
        "on the shared machine, at load\n15–22 (other engineers' test suites)",
        "medians of 3 runs, load average 8–9",
        "Measured 2026-11-23 on the shared machine (load 4–11).",
        "## Retired investigation scripts",
        "The sections run in the order the work went;",
        "## Why a case used to take ~30 s",
    ]
    for text in notes:
        assert notebook_lines(text), text
    product = [
        "look at what load_next_batch does (I/O, a lock)",
        "the model's load is balanced over 4 ranks",
        "Issues go to the tracker; see the issue template.",
        "commit `77fdb31` on the 2-core development machine",
    ]
    for text in product:
        assert not notebook_lines(text), text


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_reads_as_a_lab_notebook(page):
    found = notebook_lines(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)}: {found} (history goes in commit messages)"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_a_page_names_exists(page):
    named = set(SCRIPT.findall(page.read_text(encoding="utf-8")))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"{page.relative_to(ROOT)} names scripts that are not there: {missing}"
