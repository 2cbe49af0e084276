"""One unit system for every size commrt prints: binary units (B, KiB, MiB, GiB), as its
size flags and ``bucket_mb`` count, through :func:`commrt.sim.links.fmt_bytes`. Before,
``stats()`` said kB, the train summary KB, bench KiB and ``sync.stats`` MB. Bandwidths
stay in GB/s (10^9 bytes a second), as nccl-tests and the hardware's data sheets give them."""

import re
from pathlib import Path

from commrt.sim.links import fmt_bytes

ROOT = Path(__file__).parents[2]
#: a number formatted into a string, then a decimal or ambiguous size unit (not a rate), or
#: a table of such units and their scales
DECIMAL_SIZE = re.compile(r"\}\s*(kB|KB|MB|GB)\b(?!/s)|\(\s*[\"'](kB|KB|MB|GB)[\"'],")
#: where "MB" names the unit of ``bucket_mb`` itself, as the user typed it
ALLOWED = {("commrt/cli/units.py", 'f"{text} MB {problem}"')}


def test_no_module_prints_a_size_in_decimal_or_ambiguous_units():
    hits = []
    for path in sorted((ROOT / "commrt").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if DECIMAL_SIZE.search(line) and not any(
                rel == f and text in line for f, text in ALLOWED
            ):
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "sizes go through commrt.sim.links.fmt_bytes:\n" + "\n".join(hits)


def test_the_one_format():
    assert [fmt_bytes(n) for n in (0, 1023, 1024, 1536, 41943, 25 << 20, 1 << 30)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "40.96 KiB", "25 MiB", "1 GiB",
    ]  # fmt: skip
