"""``commrt diagnose``: the verdict again from a stalled job's COMMRT_DUMP files
(the files a real job writes are checked in tests/multiprocess/test_stall_verdict.py)."""

import json

from commrt.cli.commands import main

CALL = {"kind": "all_reduce", "algorithm": "ring", "numel": 8, "dtype": "float32", "seq": 5}
BEFORE = {"kind": None, "in_call": False, "seq": 0}


def view(rank: int, in_call: bool) -> dict:
    pos = dict(CALL, in_call=in_call, step=0 if in_call else None, peer=(rank + 1) % 2)
    stack = [] if in_call else [["train.py", 26, "load_next_batch", True]]
    return {"rank": rank, "host": "h", "pid": 100 + rank, "state": "published",
            "position": pos, "idle_s": 9.0, "stack": stack}  # fmt: skip


def test_each_rank_s_positions_follow_the_verdict_without_the_one_before_any_call(tmp_path, capsys):
    views = [view(0, True), view(1, False)]
    for r in range(2):
        positions = [BEFORE, dict(CALL, in_call=False, seq=4), views[r]["position"]]
        data = {"rank": r, "positions": positions, "verdict": {"views": views, "stall_s": 2}}
        (tmp_path / f"rank{r}.json").write_text(json.dumps(data))
    assert main(["diagnose", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("commrt stall verdict") and "rank 1 (host h, pid 101)" in out
    listing = out[out.index("last positions") :]
    assert "no collective yet" not in listing, listing
    assert "rank 0: in all_reduce (ring, 8 × float32, call 5), step 0, waiting on rank 1" in (
        listing
    )
    assert all(len(line) <= 80 for line in out.splitlines())
