"""Write docs/configuration.md from the settings' declarations (:mod:`commrt.settings`).

The environment variables come from ``commrt.settings.VARIABLES``; the bounds are every
module-level ``*_S`` constant of the library declared as ``commrt.settings.Seconds``,
found by importing each module. ``tests/unit/test_configuration_page.py`` fails where the
page differs from what this writes.

From the repository root::

    python tools/configuration_page.py          # rewrite the page
    python tools/configuration_page.py --check  # exit 1 where it is out of date
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

INTRO = """\
# Configuration

Every environment variable commrt reads, and every timeout and bound it
keeps, on one page. Arguments (`commrt.init(...)`, `Options(...)`, the
command line's flags) win over the environment where both exist; each
argument's own page says so.

Each setting is declared once, in the library (`commrt.settings`); this page
is written from those declarations by `python tools/configuration_page.py`.
"""

INTERNAL = """\
## Set by commrt for its own processes

Do not set these: commrt's launcher (`commrt train --nproc N`, `commrt bench`)
or `import commrt` sets them for the processes it makes, and reads them
there.
"""

BOUNDS = """\
## Timeouts and bounds

Every wait in commrt is bounded. The timeout you give (`commrt.init(timeout=)`,
`--timeout`, the process group's `timeout`) bounds the waits of collectives;
the constants below bound the rest. Each is a module-level name, declared
beside its use.
"""


def seconds_text(value: float) -> str:
    """A bound as the page shows it: 100 µs, 0.5 ms, 20 ms, 0.25 s, 300 s, 1e8 s."""
    if value >= 1e6:
        return f"{value:.0e} s".replace("e+0", "e").replace("e+", "e")
    if value >= 0.1:
        return f"{value:g} s"
    if value >= 5e-4:
        return f"{value * 1e3:g} ms"
    return f"{value * 1e6:g} µs"


def bounds() -> list[tuple[str, object]]:
    """``(module.NAME, declaration)`` of every ``*_S`` bound of the library, in module
    order; a ``*_S`` constant that is no :class:`~commrt.settings.Seconds` is an error."""
    import commrt
    import commrt.algorithms
    import commrt.kernels
    from commrt.settings import Seconds

    found, undeclared, names = [], [], []
    # algorithms/ and kernels/ are installed into commrt from folders of their own
    for package in (commrt, commrt.algorithms, commrt.kernels):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name not in names and info.name != "commrt.__main__":
                names.append(info.name)
    for name in names:
        module = importlib.import_module(name)
        assigned = set(re.findall(r"^([A-Z][A-Z0-9_]*_S) = ", inspect.getsource(module), re.M))
        for constant in sorted(assigned, key=list(vars(module)).index):
            value = getattr(module, constant)
            if isinstance(value, Seconds):
                found.append((f"{name}.{constant}", value))
            else:
                undeclared.append(f"{name}.{constant}")
    if undeclared:
        raise SystemExit(f"*_S constants not declared as commrt.settings.Seconds: {undeclared}")
    return found


def table(header: str, rows: list[list[str]]) -> str:
    cols = header.split(" | ")
    lines = [f"| {header} |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render() -> str:
    """The page's text."""
    from commrt import settings

    users = [v for v in settings.VARIABLES if not v.set_by]
    internal = [v for v in settings.VARIABLES if v.set_by]
    parts = [
        INTRO,
        "## Environment variables you set\n",
        table(
            "variable | default (type) | meaning | where it applies",
            [[f"`{v.name}`", f"{v.default_words} ({v.kind})", v.help, v.applies] for v in users],
        ),
        INTERNAL,
        table("variable | set by | meaning", [[f"`{v.name}`", v.set_by, v.help] for v in internal]),
        BOUNDS,
    ]
    declared = bounds()
    for group in settings.GROUPS:
        rows = [
            [f"`{name}`", seconds_text(b), b.help, b.applies]
            for name, b in declared
            if b.group == group
        ]
        if rows:
            parts.append(f"### {group}\n")
            parts.append(table("constant | value | meaning | where it applies", rows))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PAGE.read_text("utf-8") != text:
            print(f"{PAGE} is out of date: run python tools/configuration_page.py")
            return 1
        return 0
    PAGE.write_text(text, "utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
