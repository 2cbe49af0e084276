"""``commrt train --straggler``: the delays injected before each step.

``RANK:SECONDS`` slows one rank by a fixed delay; ``exp:MEAN``,
``pareto:MEAN[:SHAPE]`` and ``lognormal:MEAN[:SIGMA]`` make every rank draw
a delay each step from a :mod:`commrt.sim` distribution, seeded per (rank,
step). (``--kill RANK:STEP`` needs no more than its pair of numbers.)

:func:`peer_failed`: what a rank does when a peer died under it, in one line,
and that line's parts for the launcher, which names the dead rank's signal
first and adds them (:func:`commrt.cli.launch.peer_reports`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from commrt import settings, sim
from commrt.errors import RAISE_TIMEOUT, CommError
from commrt.runtime.choice import Backend


def in_cli_terms(error: BaseException) -> str:
    """``error``'s message as ``commrt train`` says it: the timeout is its ``--timeout``."""
    return str(error).replace(RAISE_TIMEOUT, "--timeout")


def peer_failed(rank: int, step: int, error: CommError, backend: Backend) -> None:
    """End this rank after ``error`` (a :class:`~commrt.errors.CommError`: a peer died or
    stopped) in training step ``step``, with one line and no traceback (``--verbose`` keeps
    the traceback). Under commrt's own launcher the line's parts go to it instead (over gloo:
    MPI ends every rank itself), and it prints them after the dead rank's signal."""
    from commrt.diagnosis.abort import end_job  # lazy: it imports torch, which --straggler's
    # check in the launcher (a process that imports no torch) does not need

    first = in_cli_terms(error).splitlines()[0] if str(error) else type(error).__name__
    report = {
        "rank": rank,
        "step": step,
        "peers": error.peers or [error.peer],
        "where": error.where or None,
        "error": f"{type(error).__name__}: {first}",
    }
    folder = settings.PEER_REPORTS.text()
    if folder and not backend.one_death_ends_all:
        with open(os.path.join(folder, f"{rank}.json"), "w") as f:
            json.dump(report, f)
        sys.stdout.flush()
        os._exit(1)
    said = f" in {report['where']}" if report["where"] else ""
    end_job(
        f"commrt: rank {rank}: a peer failed at training step {step}{said}: {first} "
        "(--verbose for the traceback)"
    )


@dataclass(frozen=True)
class Stragglers:
    """Injected delays before each step: fixed seconds for chosen ranks, and a delay every
    rank draws each step from ``draw`` (a :mod:`commrt.sim` delay), seeded per (rank, step).

    Example::

        >>> Stragglers.parse("1:0.02").delay(1, 0)
        0.02
        >>> s = Stragglers.parse("pareto:0.01")      # mean 10 ms, Pareto shape 2
        >>> s.delay(0, 5) == s.delay(0, 5)           # the same draw every time
        True
    """

    fixed: tuple[tuple[int, float], ...] = ()
    draw: object = None
    seed: int = 0

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "Stragglers":
        """``RANK:SECONDS``, ``exp:MEAN``, ``pareto:MEAN[:SHAPE]`` or ``lognormal:MEAN[:SIGMA]``,
        comma-separated; at most one distribution. ValueError names the part and the value
        that is wrong (an unknown kind, a value that is not a finite number, ...)."""
        fixed, draw = [], None
        for part in text.split(","):
            kind, *vals = part.strip().split(":")
            names = _value_names(kind, vals)
            nums = [_value(kind, n, v) for n, v in zip(names, vals)]
            if kind in DELAY_KINDS:
                if draw is not None:
                    raise ValueError("give at most one distribution")
                draw = _distribution(kind, *nums)
            else:
                fixed.append((int(kind), nums[0]))
        return cls(tuple(fixed), draw, seed)

    def delay(self, rank: int, step: int) -> float:
        d = dict(self.fixed).get(rank, 0.0)
        if self.draw is not None:
            d += float(self.draw.sample(np.random.default_rng([self.seed, rank, step]), 1)[0])
        return d

    def __str__(self) -> str:
        parts = [f"rank {r}: {sec:g} s" for r, sec in self.fixed]
        return ", ".join(parts + ([f"every rank: {self.draw}"] if self.draw is not None else []))


#: the delay distributions --straggler takes, and the values each takes after its name
DELAY_KINDS = {"exp": ("MEAN",), "pareto": ("MEAN", "SHAPE"), "lognormal": ("MEAN", "SIGMA")}
_FORMS = "RANK:SECONDS, exp:MEAN, pareto:MEAN[:SHAPE] or lognormal:MEAN[:SIGMA]"


def _value_names(kind: str, vals: list[str]) -> tuple[str, ...]:
    """What each value after ``kind`` means (ValueError for an unknown kind or a wrong count)."""
    if kind in DELAY_KINDS:
        names = DELAY_KINDS[kind]
    elif kind.lstrip("-").isdigit():
        names = ("SECONDS",)
    else:
        raise ValueError(
            f"unknown kind {kind!r}: start with a rank number or one of "
            f"{', '.join(DELAY_KINDS)}; use {_FORMS}"
        )
    if not 1 <= len(vals) <= len(names):
        form = "RANK:SECONDS" if names == ("SECONDS",) else f"{kind}:MEAN"
        extra = f"[:{names[1]}]" if len(names) > 1 else ""
        raise ValueError(f"{kind}:{':'.join(vals)}: use {form}{extra}, e.g. 1:0.02 or pareto:0.01")
    return names


def _value(kind: str, name: str, text: str) -> float:
    """One value of a --straggler part: a finite number, >= 0, and in range for ``name``."""
    kind = kind if kind in DELAY_KINDS else f"rank {kind}"
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{kind}'s {name} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"{kind}'s {name} must be a finite number, got {text}")
    if name == "SIGMA" and v <= 0:
        raise ValueError(f"lognormal's SIGMA (the spread) must be above 0, got {text}")
    if v < 0:
        raise ValueError(f"{kind}'s {name} must be non-negative seconds, got {text}")
    if name == "SHAPE" and v <= 1:
        raise ValueError(f"pareto's shape must be above 1 (else the mean is infinite), got {text}")
    return v


def _distribution(kind: str, mean: float, *shape: float):
    if kind == "exp":
        return sim.Exponential.from_mean(mean)
    if kind == "pareto":
        return sim.Pareto.from_mean(mean, *shape)
    return sim.LogNormal.from_mean(mean, *shape)
