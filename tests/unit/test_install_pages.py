"""The README, the quickstart, the docs' home page and the install page say one thing about
what their set-up command installs.

From the public package index on Linux, ``pip install torch==2.13.0`` is a CUDA build of
several GB; the CPU build comes from PyTorch's CPU index. The README once promised that
installing that version first kept pip from pulling a CUDA build, which held only where a
CPU wheel lay on the machine's disk. Each page now carries the README's paragraph word for
word, after the same command, and the paragraph names the CUDA build, its size and the way
to the CPU build.
"""

from __future__ import annotations

import re

from helpers.layout import ROOT

PAGES = ("README.md", "docs/quickstart.md", "docs/index.md", "docs/install.md")
COMMAND = "pip install torch==2.13.0 && pip install -e '.[train]' && commrt train"
#: the paragraph's first words, in the README
OPENING = "From the public package index on Linux,"


def _words(text: str) -> str:
    return " ".join(text.split())


def _paragraph(page: str) -> str:
    text = (ROOT / page).read_text("utf-8")
    assert OPENING in text, f"{page} says nothing of what its command installs"
    start = text.index(OPENING)
    return _words(text[start : text.find("\n\n", start)])


def test_every_page_runs_the_same_set_up_command_editable():
    for page in PAGES:
        text = (ROOT / page).read_text("utf-8")
        assert f"```bash\n{COMMAND}\n```" in text, page
        # one way to install from the clone on every page: editable (install.md says why)
        assert not re.search(r"pip install\s+'\.\[", text), f"{page} installs non-editable"


def test_every_page_says_the_same_true_thing_about_what_it_installs():
    said = _paragraph("README.md")
    for fact in ("CUDA build", "GB", "--index-url https://download.pytorch.org/whl/cpu"):
        assert fact in said, fact
    assert "keeps pip from pulling" not in said
    for page in PAGES[1:]:
        assert _paragraph(page) == said, page
