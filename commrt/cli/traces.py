"""``commrt train --trace``: each rank's timeline, and rank 0's merge of them.

``--trace out/trace.json`` leaves ``out/trace.ranks/rank<i>.json`` per rank
and the merged ``out/trace.json`` (open it in https://ui.perfetto.dev).
"""

from __future__ import annotations

import os


def rank_dir(trace: str) -> str:
    """Where the per-rank traces of ``trace`` go: ``out/trace.json`` → ``out/trace.ranks``."""
    return os.path.splitext(trace)[0] + ".ranks"


def save_rank_trace(trace: str | None, sync, rank: int) -> None:
    """This rank's timeline (nothing without ``--trace``)."""
    if trace:
        os.makedirs(rank_dir(trace), exist_ok=True)
        sync.save_trace(os.path.join(rank_dir(trace), f"rank{rank}.json"))


def merge_rank_traces(trace: str | None, comm) -> str | None:
    """Rank 0 merges the ranks' traces (those that were written) into ``trace``."""
    if not (trace and comm.rank == 0):
        return None
    from commrt.training.trace import merge_traces

    paths = [os.path.join(rank_dir(trace), f"rank{r}.json") for r in range(comm.world_size)]
    return merge_traces([p for p in paths if os.path.exists(p)], trace)
