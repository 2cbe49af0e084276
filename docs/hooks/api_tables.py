"""An mkdocs hook: each cell of an API table carries its column's name (``data-label``).

mkdocstrings lays a function's parameters out as a table of four columns (name, type,
description, default). On a phone (390 pixels) those columns do not fit, and the table
scrolled sideways. ``stylesheets/extra.css`` stacks such a table's cells there instead,
one row under another, and shows each cell's column name above it from this attribute:
CSS cannot read a column's header from a cell. Build code for the docs; mkdocs.yml loads
it (``hooks``) and keeps it out of the site.
"""

from __future__ import annotations

import re

#: a table whose rows are mkdocstrings' section items (Parameters, Returns, Raises, ...)
TABLE = re.compile(r"<table>(?:(?!</table>).)*?doc-section-item.*?</table>", re.S)
HEADER = re.compile(r"<th>(.*?)</th>", re.S)
ROW = re.compile(r'(<tr class="doc-section-item">)(.*?)(</tr>)', re.S)
CELL = re.compile(r"<td>")


def label_cells(table: str) -> str:
    """``table`` with each row's cells labelled by their column's header, in order."""
    headers = [h.strip() for h in HEADER.findall(table)]

    def row(m: re.Match) -> str:
        cells = iter(headers)
        # a description that held a table of its own would have more cells than headers:
        # those keep no label rather than a wrong one
        body = CELL.sub(lambda c: f'<td data-label="{next(cells, "")}">', m.group(2))
        return m.group(1) + body.replace(' data-label=""', "") + m.group(3)

    return ROW.sub(row, table)


def on_page_content(html: str, **kwargs) -> str:
    return TABLE.sub(lambda m: label_cells(m.group(0)), html)
