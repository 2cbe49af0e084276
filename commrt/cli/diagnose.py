"""``commrt diagnose DIR``: the stall verdict again, from the files a stalled job left.

With ``COMMRT_DUMP=DIR`` each rank of a job that stalled wrote
``DIR/rank<r>.json`` (:mod:`commrt.diagnosis.stall`): its last positions and
the verdict, with every rank's view. This command judges those views again
(:func:`commrt.diagnosis.verdict.judge`: a pure function, nothing of the job
needed) and prints the verdict as the job printed it, then each rank's last
positions. Files are read as JSON only.
"""

from __future__ import annotations

import glob
import json
import os
import sys

from commrt.diagnosis.verdict import call_text, judge, render, wrap


def register(sub) -> None:
    """Add ``diagnose`` to ``commrt``'s sub-commands."""
    p = sub.add_parser("diagnose", help="print a stalled job's verdict from its COMMRT_DUMP files")
    p.add_argument("folder", help="the folder COMMRT_DUMP named (rank<r>.json files)")
    p.add_argument(
        "--positions", type=int, default=3, help="last positions shown per rank (default 3)"
    )
    p.set_defaults(run=cmd_diagnose, single_process=True, parser=p)


def load(folder: str) -> list[dict]:
    """The ``rank<r>.json`` files in ``folder``, in rank order."""
    files = []
    for path in glob.glob(os.path.join(folder, "rank*.json")):
        with open(path) as f:
            files.append(json.load(f))
    return sorted(files, key=lambda d: d.get("rank", 0))


def verdict_of(files: list[dict]) -> dict | None:
    """The verdict judged again from the views the files carry (the same on every rank)."""
    for data in files:
        verdict = data.get("verdict") or {}
        if verdict.get("views"):
            return judge(verdict["views"], verdict.get("stall_s"))
    return None


def cmd_diagnose(args) -> int:
    try:
        files = load(args.folder)
    except (OSError, ValueError) as e:
        print(f"commrt diagnose: {args.folder}: {e}", file=sys.stderr)
        return 2
    if not files:
        print(f"commrt diagnose: no rank*.json files in {args.folder}", file=sys.stderr)
        return 2
    verdict = verdict_of(files)
    print(render(verdict) if verdict else "commrt diagnose: the files hold no verdict")
    if args.positions > 0:
        print(f"\nlast positions ({len(files)} file{'s' * (len(files) != 1)}):")
        for data in files:
            for pos in positions_of(data)[-args.positions :]:
                for line in wrap(f"  rank {data.get('rank')}: {position_text(pos)}"):
                    print(line)
    return 0


def positions_of(data: dict) -> list[dict]:
    """A rank's kept positions, without the one from before its first collective (the
    watch's first sample) where a later one follows."""
    kept = data.get("positions", [])
    return [p for p in kept if p.get("kind") is not None] or kept[-1:]


def position_text(pos: dict) -> str:
    """One position in a line: in or after which call, and the peer it waits on."""
    if pos.get("kind") is None:
        return "no collective yet"
    if not pos.get("in_call"):
        return f"after {call_text(pos)}"
    return f"in {call_text(pos)}, step {pos.get('step')}, waiting on rank {pos.get('peer')}"
