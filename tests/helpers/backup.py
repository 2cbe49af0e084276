"""Reading and checking what the backup-workers ranks wrote."""

import json

import torch

#: ranks in the backup-workers tests
N_RANKS = 4


def failures(codes, outs):
    """The output of the ranks that failed, for assertion messages."""
    return "\n".join(
        f"--- rank {r} exited {c}\n{o[-3000:]}"
        for r, (c, o) in enumerate(zip(codes, outs))
        if c not in (0, -9)
    )


def load(out, case, ranks=range(N_RANKS)):
    recs = [json.loads((out / f"{case}_rank{r}.json").read_text()) for r in ranks]
    states = [torch.load(out / f"{case}_rank{r}.pt") for r in ranks]
    return recs, states


def assert_identical(states):
    keys = sorted(states[0])
    assert any(k.startswith("state/") for k in keys), "no optimizer state to compare"
    for r, st in enumerate(states[1:], 1):
        assert sorted(st) == keys, (r, sorted(st), keys)
        diff = [k for k in keys if not torch.equal(st[k], states[0][k])]
        assert diff == [], f"rank {r} differs from rank 0 in {diff}"


def participants_by_step(recs):
    """{global step: on-time ranks}, checked to be the same on every rank that took part."""
    parts = {}
    for r in recs:
        for s in r["steps"]:
            if s["role"] == "on time":
                g = s["computed_at"]
                assert parts.setdefault(g, s["participants"]) == s["participants"], (g, parts[g], s)
                assert r["rank"] in s["participants"]
    return parts


RAW = ("Connection reset by peer", "Connection closed by peer", "gloo/transport")
