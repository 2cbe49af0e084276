"""Look at the docs site as a reader does: headless Chromium, on a laptop and on a phone.

    python tools/docs_check.py                  # build the site, check every page
    python tools/docs_check.py --width 390      # as a phone shows it
    python tools/docs_check.py --site DIR       # a site built already
    python tools/docs_check.py --shots DIR      # also a screenshot of each page, DIR/NAME.png

Builds the site (``mkdocs build --strict``) unless ``--site`` names one, serves it on
127.0.0.1 and loads every page in the browser at ``--width`` pixels. On each page it
measures what a stylesheet or a long line can spoil and no HTML scan can see:

* a name or a flag in a table cell's code that the browser broke over two lines
  (``COMMRT_DEBU`` / ``G``; a line may end between words or after a dot);
* a code block with a line under the copy button at its top right corner (the end of a
  comment or a command hidden there);
* a table wider than the page's column (its last column behind a sideways scroll). On a
  phone (under :data:`PHONE_BELOW` pixels) only the API reference's tables count: a table
  of numbers or of settings on a prose page scrolls sideways there, as wide tables do on
  any phone, while a function's parameters must read without it.

Prints one line per finding and exits 1 where there is any; 2 where no Chromium is
installed (Debian's ``chromium`` package). ``tests/unit/test_docs_site.py`` runs the same
measurement on the site it builds.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the widths the docs are judged at: a laptop's browser window and a phone's screen
WIDTH = 1280
PHONE = 390
#: the theme's phone layout is narrower than this (45em)
PHONE_BELOW = 720
#: seconds one page may take in the browser
PAGE_S = 60
#: what the browser runs at the end of each page (after the stylesheets, which a script at
#: the end of the body waits for): the findings, as JSON in an element of their own
PROBE = """<script>(function () {
  var found = {broken: [], hidden: [], wide: []};
  // a name or a flag of the cell's code over two lines: broken inside
  document.querySelectorAll("td code, th code").forEach(function (c) {
    var walk = document.createTreeWalker(c, NodeFilter.SHOW_TEXT), node, word, range;
    while ((node = walk.nextNode())) {
      var words = /[\\w-]+/g;
      while ((word = words.exec(node.data))) {
        range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        if (range.getClientRects().length > 1) found.broken.push(word[0]);
      }
    }
  });
  // the theme's copy button, as its script places it (in a nav before the code, inside
  // the pre) and as the stylesheets show it: which lines of the code run under it. The
  // script adds it after this probe has run, so the probe adds the same markup a moment.
  document.querySelectorAll("pre > code").forEach(function (c) {
    var nav = c.parentElement.querySelector(".md-code__nav"), added = !nav;
    if (added) {
      nav = document.createElement("nav");
      nav.className = "md-code__nav";
      nav.innerHTML = '<button class="md-code__button" data-md-type="copy"></button>';
      c.parentElement.insertBefore(nav, c);
    }
    var button = nav.querySelector(".md-code__button, .md-clipboard").getBoundingClientRect();
    var range = document.createRange(), under = false;
    if (button.width > 0) {  // shown: extra.css hides it on output and signatures
      range.selectNodeContents(c);
      Array.prototype.forEach.call(range.getClientRects(), function (r) {
        if (r.width > 0 && r.top < button.bottom && r.bottom > button.top &&
            r.right > button.left && r.left < button.right) under = true;
      });
    }
    if (added) nav.remove();
    if (under) found.hidden.push(c.textContent.split("\\n")[0]);
  });
  // a table wider than the page's column: the reader scrolls sideways for its last column
  document.querySelectorAll(".md-typeset table:not([class])").forEach(function (t) {
    if (t.scrollWidth > t.clientWidth + 1) {
      found.wide.push({head: t.rows[0].textContent.trim(), api: !!t.closest(".doc-contents")});
    }
  });
  var out = document.createElement("pre");
  out.id = "commrt-probe";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
})();</script>"""
FOUND = re.compile(r'<pre id="commrt-probe">(.*?)</pre>', re.S)


def chromium() -> str | None:
    """The browser's command, or None where none is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build(out: Path) -> None:
    """``mkdocs build --strict`` into ``out``; raises with mkdocs' output on failure."""
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)]
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"mkdocs build failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def pages(site: Path) -> list[str]:
    """Every page of ``site`` as a path under its root ("configuration/index.html")."""
    return sorted(str(p.relative_to(site)) for p in site.rglob("index.html"))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would bury the findings
        pass


class Served:
    """A copy of ``site`` with :data:`PROBE` at the end of every page, served on
    127.0.0.1 (a free port) until :meth:`close`."""

    def __init__(self, site: Path):
        self.folder = Path(tempfile.mkdtemp(prefix="commrt-docs-"))
        shutil.copytree(site, self.folder, dirs_exist_ok=True)
        for page in self.folder.rglob("*.html"):
            text = page.read_text("utf-8")
            page.write_text(text.replace("</body>", PROBE + "</body>", 1), "utf-8")
        handler = functools.partial(_Quiet, directory=str(self.folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, page: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{page}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _browser(browser: str, width: int, height: int, *args: str) -> list[str]:
    return [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", f"--window-size={width},{height}", *args,
    ]  # fmt: skip


def measure(browser: str, url: str, width: int = WIDTH) -> dict:
    """The findings on the page at ``url``: ``broken`` (table-cell code words over two lines)
    ``hidden`` (the first line of each code block with a line under the copy button) and
    ``wide`` (each table wider than the page's column: its header row, ``head``, and
    whether it is an API table, ``api``)."""
    cmd = _browser(browser, width, 900, "--dump-dom", url)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PAGE_S)
    match = FOUND.search(proc.stdout)
    if match is None:
        raise RuntimeError(f"{url}: the browser gave no measurement:\n{proc.stderr[-2000:]}")
    import html

    return json.loads(html.unescape(match.group(1)))


def screenshot(browser: str, url: str, path: Path, width: int = WIDTH) -> None:
    """A picture of the page at ``url``, ``width`` wide, its first 2,400 pixels."""
    cmd = _browser(browser, width, 2400, f"--screenshot={path}", url)
    subprocess.run(cmd, capture_output=True, timeout=PAGE_S, check=True)


def check(
    site: Path,
    browser: str,
    width: int = WIDTH,
    shots: Path | None = None,
    only: list[str] | None = None,
) -> list[str]:
    """One line per finding over every page of ``site``, or over the pages ``only`` names
    (as :func:`pages` names them); none: the site reads well."""
    chosen = pages(site)
    if only is not None:
        missing = sorted(set(only) - set(chosen))
        if missing:
            raise ValueError(f"no such page in {site}: {', '.join(missing)}")
        chosen = [p for p in chosen if p in only]
    served, findings = Served(site), []
    try:
        for page in chosen:
            url = served.url(page)
            found = measure(browser, url, width)
            name = page.removesuffix("index.html").rstrip("/") or "home"
            findings += [
                f"{name}: a name in a table cell broken over lines: {c!r}" for c in found["broken"]
            ]
            findings += [f"{name}: code line under the copy button: {c!r}" for c in found["hidden"]]
            findings += [
                f"{name}: table wider than the page, headed {t['head']!r}"
                for t in found["wide"]
                if t["api"] or width >= PHONE_BELOW
            ]
            if shots is not None:
                screenshot(browser, url, shots / (name.replace("/", "-") + ".png"), width)
    finally:
        served.close()
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="a built site (default: build one)")
    parser.add_argument("--shots", type=Path, help="also save a screenshot of each page here")
    parser.add_argument("--width", type=int, default=WIDTH, help="window width (default 1280)")
    args = parser.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("docs_check: no Chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="commrt-site-") as tmp:
        site = args.site
        if site is None:
            site = Path(tmp)
            build(site)
        if args.shots is not None:
            args.shots.mkdir(parents=True, exist_ok=True)
        findings, count = check(site, browser, args.width, args.shots), len(pages(site))
    for line in findings:
        print(line)
    print(f"docs_check: {count} pages at {args.width} px, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
