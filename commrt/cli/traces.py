"""Chrome-trace timelines: ``commrt trace merge``, and ``commrt train --trace``.

``commrt trace merge -o OUT.json IN.json...`` merges per-rank trace files
into one. ``commrt train --trace out/trace.json`` leaves
``out/trace.ranks/rank<i>.json`` per rank and rank 0's merge of them,
``out/trace.json``. Open either in https://ui.perfetto.dev.
"""

from __future__ import annotations

import os
import sys

from commrt.cli.units import output_file


def register(sub) -> None:
    """Add ``trace`` (with ``merge``) to ``commrt``'s sub-commands."""
    trace = sub.add_parser("trace", help="work with Chrome-trace timelines")
    tsub = trace.add_subparsers(dest="what")
    merge = tsub.add_parser(
        "merge", help="merge per-rank trace files into one (open in ui.perfetto.dev)"
    )
    merge.add_argument(
        "-o", "--output", required=True, type=output_file, help="merged JSON file to write"
    )
    merge.add_argument("inputs", nargs="+", help="per-rank trace JSON files")
    merge.set_defaults(run=cmd_trace_merge, single_process=True, parser=merge)
    trace.set_defaults(parser=trace, subcommands=tuple(tsub.choices))


def cmd_trace_merge(args) -> int:
    from commrt.runtime.trace import merge_traces

    missing = [p for p in args.inputs if not os.path.exists(p)]
    if missing:
        print(f"commrt trace merge: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        out = merge_traces(args.inputs, args.output)
    except ValueError as e:
        print(f"commrt trace merge: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(args.inputs)} traces into {out}")
    return 0


# ------------------------------------------------------------ commrt train --trace


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
    from commrt.runtime.trace import merge_traces

    paths = [os.path.join(rank_dir(trace), f"rank{r}.json") for r in range(comm.world_size)]
    return merge_traces([p for p in paths if os.path.exists(p)], trace)
