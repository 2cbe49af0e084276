"""The stall verdict as a pure function: views in, one verdict out (commrt.diagnosis.verdict)."""

from commrt.diagnosis.verdict import WIDTH, judge, pointer, printer, ranks_text, render

CALL = {"kind": "all_reduce", "algorithm": "ring", "numel": 2, "dtype": "float32", "seq": 7}
USER_STACK = [
    ["train.py", 90, "<module>", True],
    ["train.py", 40, "main", True],
    ["train.py", 12, "load_next_batch", True],
    ["/usr/lib/python3.12/threading.py", 300, "wait", False],
]


def waiting(rank, peer, **call):
    pos = dict(CALL, in_call=True, step=0, peer=peer, **call)
    return {"rank": rank, "host": "h", "pid": 100 + rank, "state": "published",
            "position": pos, "idle_s": 9.0, "stack": []}  # fmt: skip


def idle(rank, stack=USER_STACK):
    pos = dict(CALL, in_call=False, seq=6)
    return {"rank": rank, "host": "h", "pid": 100 + rank, "state": "published",
            "position": pos, "idle_s": 12.0, "stack": stack}  # fmt: skip


def absent(rank, state):
    return {"rank": rank, "host": "h", "pid": 100 + rank, "state": state,
            "position": dict(CALL, in_call=True, step=0, peer=0), "idle_s": 5.0, "stack": []}  # fmt: skip


def text(verdict):
    out = render(verdict)
    assert all(len(line) <= WIDTH for line in out.splitlines()), out
    return out


def test_a_rank_in_user_code_is_named_with_its_innermost_user_frame():
    v = judge([waiting(0, 3), waiting(1, 3), waiting(2, 3), idle(3)])
    assert (v["kind"], v["root"], v["waiting"]) == ("user code", 3, [0, 1, 2])
    out = text(v)
    assert "rank 3" in out and "IN USER CODE" in out
    assert out.index("train.py:12 in load_next_batch") < out.index("train.py:40 in main")
    frames = [line for line in out.splitlines() if "innermost:" not in line]
    assert "threading.py" not in "\n".join(frames) and "ranks 0-2" in out


def test_the_innermost_frame_of_the_stuck_thread_is_shown_too():
    out = text(judge([waiting(0, 1), idle(1), waiting(2, 1), waiting(3, 2)]))
    lines = out.splitlines()
    at = lines.index("    train.py:12 in load_next_batch")
    assert lines[at + 3] == "    innermost: /usr/lib/python3.12/threading.py:300 in wait", out


def test_a_chain_of_waits_is_followed_to_its_root():
    v = judge([waiting(0, 1), waiting(1, 2), waiting(2, 3), idle(3)])
    assert (v["kind"], v["root"], v["chain"]) == ("user code", 3, [0, 1, 2, 3])
    assert "rank 0 -> rank 1 -> rank 2 -> rank 3" in text(v)


def test_stopped_and_dead_ranks_are_judged_from_what_the_others_saw():
    for state, word in (("stopped", "STOPPED"), ("dead", "DEAD"), ("lost", "LOST")):
        v = judge([waiting(0, 2), waiting(1, 0), absent(2, state), waiting(3, 2)])
        assert (v["kind"], v["root"], v["waiting"]) == (state, 2, [0, 1, 3])
        assert word in text(v)


def test_a_rank_in_another_collective_is_named_beside_the_others_call():
    other = waiting(2, 0, kind="broadcast", algorithm="binomial_tree")
    v = judge([waiting(0, 3), waiting(1, 0), other, waiting(3, 2)])
    assert (v["kind"], v["root"]) == ("other collective", 2)
    out = text(v)
    flat = " ".join(out.split())
    assert "broadcast (binomial_tree, 2 × float32, call 7) on rank 2," in flat, out
    assert "while ranks 0,1,3 are in all_reduce (ring, 2 × float32, call 7)" in flat, out


def test_a_size_mismatch_in_a_first_call_check_names_both_sizes_and_their_ranks():
    check = dict(CALL, in_call=True, step=0, peer=None, numel=999, algorithm="ring, first call")
    one = {**waiting(1, 0), "position": check}
    v = judge(
        [waiting(0, 3, numel=1000), one, waiting(2, 1, numel=1000), waiting(3, 2, numel=1000)]
    )
    assert (v["kind"], v["root"]) == ("other collective", 1)
    flat = " ".join(text(v).split())
    assert "999 × float32, call 7) on rank 1," in flat and "IN USER CODE" not in flat
    assert "while ranks 0,2,3 are in all_reduce (ring, 1000 × float32, call 7)" in flat


def test_a_later_call_of_the_same_collective_is_another_collective():
    v = judge([waiting(0, 1), waiting(1, 2, seq=8), waiting(2, 0), waiting(3, 0)])
    assert (v["kind"], v["root"]) == ("other collective", 1)


def test_the_root_most_ranks_wait_on_wins_and_the_others_are_listed():
    v = judge([waiting(0, 1), idle(1), waiting(2, 1), idle(3)])
    assert v["root"] == 1 and v["others"] == {"3": "user code"}
    assert "also: rank 3 is user code" in text(v)


def test_a_dead_rank_beats_a_rank_in_user_code_on_a_tie():
    v = judge([waiting(0, 1), idle(1), waiting(2, 3), absent(3, "dead")])
    assert (v["kind"], v["root"]) == ("dead", 3)


def test_a_dead_rank_is_the_root_though_more_ranks_wait_on_one_in_user_code():
    """Under torchrun a survivor of a killed rank may be in its data loader at that moment,
    and the ranks after it in the ring wait on it: the death is still the cause."""
    v = judge([waiting(0, 2), absent(1, "dead"), idle(2), waiting(3, 2)])
    assert (v["kind"], v["root"]) == ("dead", 1) and v["others"] == {"2": "user code"}


def test_a_dropped_rank_is_never_blamed():
    v = judge([waiting(0, 1), idle(1), waiting(2, 1), absent(3, "dropped")])
    assert v["root"] == 1 and v["dropped"] == [3]
    assert "dropped by backup workers (not a hang): rank 3" in text(v)


def test_ranks_that_wait_on_each_other_have_no_single_root():
    v = judge([waiting(0, 1), waiting(1, 0), waiting(2, 1), waiting(3, 2)])
    assert v["root"] is None and v["kind"] == "cycle"
    assert "no single root" in text(v)


def test_no_stall_when_every_rank_runs():
    assert judge([idle(0), idle(1)])["kind"] == "none"  # nobody waits: nobody to blame
    assert judge([idle(0), absent(1, "dead")])["root"] == 1


def test_the_verdict_is_a_function_of_the_views_alone():
    views = [waiting(0, 1), waiting(1, 2), waiting(2, 3), idle(3)]
    assert judge(views) == judge([dict(v) for v in views])


def test_ranks_text():
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 1, 2, 5]) == "ranks 0-2,5"
    assert ranks_text([0, 1, 3]) == "ranks 0,1,3"


def test_ranks_in_a_barrier_wait_on_the_rank_that_is_not_there():
    views = [waiting(r, None, kind="barrier", algorithm="transport") for r in range(3)]
    v = judge(views + [idle(3)])
    assert (v["kind"], v["root"], v["waiting"]) == ("user code", 3, [0, 1, 2])
    assert "in barrier (call 7)" in " ".join(text(v).split())


def test_a_call_number_stays_with_its_word_when_a_line_wraps():
    from commrt.diagnosis.verdict import wrap

    long = (
        "  all_reduce (auto:recursive_doubling, 650 × float32, torch allreduce(sum), call\u00a027)"
    )
    lines = wrap(long)
    assert len(lines) == 2 and lines[1].strip() == "call 27)", lines
    assert all(len(x) <= 80 and "\u00a0" not in x for x in lines), lines
    assert wrap("in barrier (call\u00a07)") == ["in barrier (call 7)"]


def test_one_rank_per_host_prints_the_verdict_and_the_others_point_to_it():
    views = [waiting(0, 3), waiting(1, 0), waiting(2, 1), idle(3)]
    views[0]["host"] = "g"  # rank 0 prints on host g, rank 1 on host h
    v = judge(views) | {"views": views}
    assert (printer(v, "h"), printer(v, "g"), printer(v, "elsewhere")) == (1, 0, None)
    gone = {**v, "views": [views[0], {**views[1], "state": "dead"}, *views[2:]]}
    assert printer(gone, "h") == 2  # a rank that did not answer prints nothing
    line = pointer(v, 2, "rank 1 prints it in full")
    assert all(len(x) <= WIDTH for x in line.splitlines()), line
    flat = " ".join(line.split())
    assert flat.startswith("commrt: rank 2: stall verdict (rank 1 prints it in full): rank 3 ")
    assert flat.endswith("is IN USER CODE at train.py:12 in load_next_batch."), flat


def test_the_pointer_to_another_collective_is_one_whole_sentence():
    """The cause's lines are joined before wrapping: a line cut by the verdict's own wrap
    ("...call 24) on") never ends the pointer."""
    long = dict(algorithm="auto:recursive_doubling", numel=650, sync_step=3, bucket=1)
    views = [waiting(r, (r + 3) % 4, **long) for r in range(3)] + [waiting(3, 2, seq=8)]
    flat = " ".join(pointer(judge(views), 0, "rank 1 prints it in full").split())
    assert "rank 3 (host h, pid 103) is IN ANOTHER COLLECTIVE: all_reduce (ring" in flat, flat
    assert flat.endswith("call 7)."), flat
    assert "call 8) on rank 3, while ranks 0-2 are in all_reduce (" in flat, flat


def test_a_rank_that_left_after_its_call_failed_is_never_the_root_cause():
    """Rank 1's connection broke when the stall's first rank left; it said so in its
    farewell and ended: rank 3, in its data loader, is still the root, and the chain
    goes on through rank 1's last position."""
    left = absent(1, "left") | {"position": dict(CALL, in_call=True, step=0, peer=0)}
    v = judge([waiting(0, 3), left, waiting(2, 1), idle(3)])
    assert (v["kind"], v["root"], v["left"]) == ("user code", 3, [1])
    assert v["waiting"] == [0, 2] and v["chain"] == [2, 1, 0, 3], v
    out = text(v)
    assert "ended after a call failed under it (no cause): rank 1." in out, out
    assert "rank 1 is" not in out and "DEAD" not in out, out


def test_a_path_longer_than_the_width_stays_whole_on_a_line_of_its_own():
    from commrt.diagnosis.verdict import wrap

    path = "/tmp/" + "a-long-checkout-folder/" * 4 + "tests/workers/verdict_worker.py:32"
    lines = wrap(f"    {path} in load_next_batch")
    assert lines == [f"    {path}", "        in load_next_batch"], lines


def test_a_silent_rank_last_seen_waiting_passes_the_chain_on_to_the_rank_it_waits_on():
    """Under load a rank may miss the judge's gather: alive, it did not answer, and its
    last heartbeat had it waiting in the others' call on rank 3, which is in user code.
    Rank 3 holds everyone; the silent rank is named beside it, never the root."""
    late = absent(0, "silent") | {"position": dict(CALL, in_call=True, step=0, peer=3)}
    v = judge([late, waiting(1, 0), waiting(2, 1), idle(3)])
    assert (v["kind"], v["root"], v["chain"]) == ("user code", 3, [2, 1, 0, 3])
    assert v["others"] == {"0": "silent"} and "also: rank 0 is silent" in text(v)


def test_a_silent_rank_the_chain_leads_back_to_is_the_root():
    """The chain through a silent rank loops back to it (its peer waits on it): it is
    what holds the others."""
    late = absent(0, "silent") | {"position": dict(CALL, in_call=True, step=0, peer=1)}
    v = judge([late, waiting(1, 0), waiting(2, 1), waiting(3, 2)])
    assert (v["kind"], v["root"]) == ("silent", 0)
    assert v["waiting"] == [1, 2, 3], v


def test_code_at_module_level_is_named_by_its_file_and_line():
    """The advice named the innermost user frame's function, which at a script's top level
    is ``<module>`` ("look at what <module> does"); such a frame is named by file and line."""
    top = [["train.py", 13, "<module>", True], ["/usr/lib/python3.12/socket.py", 9, "recv", False]]
    out = " ".join(text(judge([waiting(0, 1), idle(1, stack=top)])).split())
    assert "look at what train.py:13 does" in out and "<module> does" not in out, out
    out = " ".join(text(judge([waiting(0, 1), idle(1)])).split())
    assert "look at what load_next_batch does" in out, out
