"""The optional packages some commands need, and the one line that says so.

commrt's own dependencies are torch and numpy. ``pip install 'commrt[train]'``
adds what the command line uses beyond them: scikit-learn (``commrt train``'s
digits data), matplotlib (plots: ``--plot``, ``commrt simulate``'s figures)
and tqdm (``commrt train``'s progress bar; without it the epoch lines are
printed plain). A command that lacks one says so in one line and exits
with status 2 before it starts any rank.
"""

from __future__ import annotations

import importlib.util
import sys

#: what installs every package the command line may use
TRAIN_EXTRA = "pip install 'commrt[train]'"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported: found, not imported (importing matplotlib is slow)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is missing, a module without a spec
        return False


def require(what: str, module: str, package: str, otherwise: str = "") -> None:
    """Exit with status 2 and one line on stderr unless ``module`` is installed: ``what``
    (a command, or a command's flag) needs ``package``; ``otherwise``: how to do without."""
    if installed(module):
        return
    print(f"{what} needs {package}: {TRAIN_EXTRA}{otherwise}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def check(args) -> None:
    """The packages the parsed command line ``args`` needs, checked before any rank starts
    (``commrt simulate`` checks its figures' own, :func:`commrt.cli.simulate.cmd_simulate`)."""
    command = " ".join(w for w in (args.command, args.what) if w)
    if args.command == "train":
        require("commrt train", "sklearn", "scikit-learn")
    if args.plot:
        require(f"commrt {command} --plot", "matplotlib", "matplotlib")
