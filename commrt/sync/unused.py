"""Parameters that got no gradient in a step (an unused branch of the model).

Such a parameter would leave its bucket incomplete forever, so at
``wait()`` its bucket is sent anyway with the parameter as zeros
(:func:`unready_parameters`). With ``unused="error"`` every rank then learns,
in one small exchange, which ranks skipped which parameters
(:func:`raise_if_unused`), and raises naming them before any optimizer step.
"""

from __future__ import annotations

import enum
from typing import Callable

import torch

from commrt.collectives.core import gather_rows
from commrt.sync.buckets import Bucket
from commrt.sync.step_state import StepState

#: names listed per rank in the error before "and N more"
NAMES_SHOWN = 10


class Unused(enum.Enum):
    """What ``wait()`` does about a parameter that got no gradient this step."""

    ZEROS = "zeros"
    ERROR = "error"


def unready_parameters(
    buckets: list[Bucket], state: StepState, mark_ready: Callable[[int], None]
) -> list[str]:
    """Hand every incomplete bucket to the progress thread (``mark_ready``), its missing
    gradients as zeros; the names of the parameters that got none. Caller holds the lock."""
    unused = []
    for bucket in buckets:
        if state.ready[bucket.index]:
            continue
        unused += [name for name, p in zip(bucket.names, bucket.params) if id(p) not in state.seen]
        mark_ready(bucket.index)
    return unused


def raise_if_unused(comm, buckets: list[Bucket], unused: list[str]) -> None:
    """unused="error": raise on every rank if any rank skipped parameters.

    One exchange of p counts per step; the names follow only when some
    count is not zero, so every rank takes the same branch."""
    counts = [int(c[0]) for c in gather_rows(comm, [len(unused)], torch.int64)]
    if not any(counts):
        return
    names = [n for b in buckets for n in b.names]
    index = {n: i for i, n in enumerate(names)}
    mine = [0] * len(names)
    for n in unused:
        mine[index[n]] = 1
    rows = gather_rows(comm, mine, torch.int8)
    parts = []
    for r, row in enumerate(rows):
        skipped = sorted(names[i] for i, v in enumerate(row) if v)
        if skipped:
            more = len(skipped) - NAMES_SHOWN
            parts.append(
                f"rank {r}: {', '.join(skipped[:NAMES_SHOWN])}"
                + (f" and {more} more" if more > 0 else "")
            )
    raise ValueError(
        "commrt: parameters without a gradient this step (unused='error'; reduced "
        "as zeros so that no rank hangs, and no optimizer step taken): " + "; ".join(parts)
    )
