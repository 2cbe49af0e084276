"""What gossip with a deadline did with every gradient: the ledger, and the deadline's clock.

:class:`GossipLedger` holds float64 totals over all elements of every bucket
(exact for integer-valued gradients, which the tests use), so that
``Σ over ranks of computed == Σ applied + Σ unapplied`` can be checked
exactly when no rank died and every message landed by ``close()``
(``lost == 0``). :class:`DeadlineClock` says how long a step waits for its
partner's message: a fixed number of seconds, or ``"auto"``.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import torch

from commrt.algorithms.gossip import AUTO_WARMUP, AUTO_WINDOW, auto_deadline


@dataclass
class GossipLedger:
    """Where this rank's share of every gradient went (sums of all elements, float64).

    ``computed``: Σ of this rank's own gradients (before the ½). ``applied``:
    Σ of what ``wait()`` left in the gradients, own half plus every message
    applied. ``unapplied``: Σ of what this rank held at ``close()`` that no step
    applied: messages that landed after its last step, and (asynchronous) its
    last step's own half; per bucket in ``unapplied_buckets``. ``lost``:
    messages to this rank that never landed (their sender died, or the drain
    at ``close()`` timed out): only then may the sums differ. ``staleness``:
    how many steps after its own step each applied message was applied.
    """

    computed: float = 0.0
    applied: float = 0.0
    unapplied: float = 0.0
    unapplied_buckets: list[torch.Tensor] = field(default_factory=list)
    sent: int = 0
    received: int = 0
    late: int = 0
    lost: int = 0
    lost_sends: int = 0
    #: {steps between a message's step and the step that applied it: messages}
    staleness: Counter = field(default_factory=Counter)

    def hold(self, bucket: int, buf: torch.Tensor) -> None:
        """``buf`` (on any device) stays unapplied at close (it counts under ``unapplied``,
        summed in float64 where the ledger keeps its sums: on the host)."""
        held = self.unapplied_buckets[bucket]
        add = buf.to(device=held.device, dtype=torch.float64)
        held += add
        self.unapplied += float(add.sum())

    def as_dict(self) -> dict:
        """The ledger as plain numbers (for stats and JSON)."""
        return {
            "computed": self.computed,
            "applied": self.applied,
            "unapplied": self.unapplied,
            "sent": self.sent,
            "received": self.received,
            "late": self.late,
            "lost": self.lost,
            "lost_sends": self.lost_sends,
            "staleness": dict(sorted(self.staleness.items())),
        }


class DeadlineClock:
    """Seconds a step waits for its partner's message: fixed, or ``"auto"``.

    ``"auto"``: the first ``AUTO_WARMUP`` letters are waited for in full
    (``timeout_s``), then the deadline is
    :func:`~commrt.algorithms.gossip.auto_deadline` of the exchange times
    (posting to landing) of the latest ``AUTO_WINDOW`` letters.
    """

    def __init__(self, setting: float | str, timeout_s: float):
        self.auto = setting == "auto"
        self.fixed = None if self.auto else float(setting)
        self.timeout_s = timeout_s
        self._seen = 0
        self._window: deque[float] = deque(maxlen=AUTO_WINDOW)

    def observe(self, latency: float) -> None:
        """An exchange took ``latency`` seconds from posting to landing."""
        self._seen += 1
        self._window.append(latency)

    def seconds(self) -> float:
        """The deadline of the next step, in seconds from its first bucket."""
        if not self.auto:
            return self.fixed
        if self._seen < AUTO_WARMUP:
            return self.timeout_s
        return auto_deadline(self._window)
