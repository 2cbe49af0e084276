"""An mkdocs hook: code in a table cell wraps at its dots, parentheses and commas only.

The theme lets code break anywhere, which split ``COMMRT_DEBUG`` into ``COMMRT_DEBU`` /
``G`` in a narrow column; forbidding every break instead makes a long dotted name
(``commrt.process.rendezvous.DEFAULT_TIMEOUT_S``) widen its table past the page. Here
each piece of a cell's code up to and including a ``.``, ``(``, ``,``, ``=``, ``/`` or
``|`` is one unbreakable span (``stylesheets/extra.css``), with a ``<wbr>`` after it: a
line may end after ``commrt.runtime.`` but never inside a name or a flag
(``--max-restarts``). Build code for the docs; mkdocs.yml loads it (``hooks``) and keeps
it out of the site.
"""

from __future__ import annotations

import re

#: a table cell's inline code (no attributes: the Markdown's backticks)
CELL_CODE = re.compile(r"(<td[^>]*>)(.*?)(</td>)", re.S)
CODE = re.compile(r"<code>([^<]*)</code>")
#: a piece that may not break: up to and including the characters a line may end after
PIECE = re.compile(r"[^\s.(,=/|]*[.(,=/|]+|[^\s.(,=/|]+|\s+")


def wrap_code(text: str) -> str:
    """``text`` (a code span's escaped HTML) as unbreakable pieces with a break after each."""
    out = []
    for piece in PIECE.findall(text):
        out.append(piece if piece.isspace() else f'<span class="nobr">{piece}</span><wbr>')
    return "".join(out)


def wrap_cells(html: str) -> str:
    """Every table cell's code in ``html`` wrapped by :func:`wrap_code`."""

    def cell(m: re.Match) -> str:
        body = CODE.sub(lambda c: f"<code>{wrap_code(c.group(1))}</code>", m.group(2))
        return m.group(1) + body + m.group(3)

    return CELL_CODE.sub(cell, html)


def on_page_content(html: str, **kwargs) -> str:
    return wrap_cells(html)
