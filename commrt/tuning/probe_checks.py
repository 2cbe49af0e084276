"""The probe's sanity checks (:mod:`commrt.tuning.probe`, "Sanity checks"): which measured tiers
are inconsistent, and how a tier that stays inconsistent is priced.

They read and return the probe's fields as a plain dict, so they are tested
with made-up numbers, no processes.
"""

from __future__ import annotations

import warnings

from commrt import settings

__all__ = ["ALPHA_BOUND_S", "RETRIES", "ProbeWarning", "problems", "conservative"]

ALPHA_BOUND_S = settings.Seconds(
    5e-3,
    "α above this is a burst (a rank waiting for a core), not a link: measured again, then priced "
    "as measured with a warning",
    "`auto`'s probe",
    settings.AUTO,
)
#: how many times a tier that fails a sanity check is measured again
RETRIES = 1


class ProbeWarning(UserWarning):
    """A probed tier stayed inconsistent after it was measured again (the message names the
    tier and the numbers, and how it is priced)."""


def problems(m: dict) -> list[tuple[tuple[str, ...], str]]:
    """The sanity checks ``m`` fails: (tiers to measure again, what is wrong)."""
    two = "inter_alpha_s" in m
    out = []
    for tier, where, alpha in (
        ("intra" if two else "flat", "inside a node" if two else "between ranks", m["alpha_s"]),
        ("shared", "between nodes", m.get("inter_alpha_s", 0.0)),
    ):
        if alpha > ALPHA_BOUND_S:
            out.append(
                (
                    (tier,),
                    f"α {where} measured {alpha * 1e3:.2f} ms, beyond the "
                    f"{ALPHA_BOUND_S * 1e3:.0f} ms bound (a rank waited for a core, not the link)",
                )
            )
    if two and m["beta_s_per_byte"] > m["inter_beta_s_per_byte"]:
        out.append(
            (
                ("intra", "shared"),
                f"the tier inside a node measured slower than the one between nodes: "
                f"β {m['beta_s_per_byte']:.3g} > {m['inter_beta_s_per_byte']:.3g} s/B "
                f"(ranks contending for cores?)",
            )
        )
    return out


def conservative(m: dict, problems) -> dict:
    """``m`` priced conservatively after checks that failed twice, with their warnings.

    α beyond the bound stays as measured (an upper estimate). A tier
    inside a node slower than the one above it: both are priced at the
    slower β, so a split the measurements contradict never favours the
    hierarchical schedules."""
    notes = []
    for _, what in problems:
        how = "priced as measured"
        if what.startswith("the tier inside"):
            slow = max(m["beta_s_per_byte"], m["inter_beta_s_per_byte"])
            m = m | dict(beta_s_per_byte=slow, inter_beta_s_per_byte=slow)
            how = f"both tiers priced at β {slow:.3g} s/B"
        notes.append(f"probe: {what}, after measuring it again; {how}")
    for n in notes:
        warnings.warn(n, ProbeWarning, stacklevel=3)
    return m | dict(warnings=tuple(notes))
