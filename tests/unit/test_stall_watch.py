"""The stall watch's pieces without a job: its setting, process states, which frames are
the user's, and the judge on one store where a rank never answered (commrt.diagnosis.stall)."""

import datetime
import json
import os
import signal
import subprocess
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

from commrt import settings
from commrt.diagnosis import frames, hearing, stall
from commrt.diagnosis.stall import StallWatch, stall_seconds
from commrt.schedule.position import Position
from commrt.transports.processes import state as process_state


def test_the_stall_setting(monkeypatch):
    monkeypatch.delenv(settings.STALL.name, raising=False)
    assert stall_seconds() == stall.DEFAULT_STALL_S
    # half the timeout, from a minute to five: commrt.init's 300 s, torch's 30 minutes
    assert stall_seconds(timeout=300.0) == 150.0 and stall_seconds(timeout=1800.0) == 300.0
    # not shorter than the timeout: the watch runs, the timeout declares the stall
    assert stall_seconds(timeout=30.0) == 60.0 and stall.declares(60.0, 30.0) is None
    assert stall.declares(150.0, 300.0) == 150.0 and stall.declares(20.0, 20.0) is None
    for off in ("0", "off"):
        assert stall_seconds(off) is None
    monkeypatch.setenv(settings.STALL.name, "2.5")
    assert stall_seconds() == 2.5 and stall_seconds(7) == 7.0
    with pytest.raises(ValueError, match="COMMRT_STALL_S"):
        stall_seconds("soon")
    with pytest.raises(ValueError, match="positive"):
        stall_seconds("-3")


def test_the_watch_meets_in_the_tcp_store_under_any_prefix_stores():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30))
    nested = dist.PrefixStore("commrt/", dist.PrefixStore("default_pg/", server))
    assert stall.tcp_under(server) is server
    tcp = stall.tcp_under(nested)
    assert isinstance(tcp, dist.TCPStore) and (tcp.host, tcp.port) == (server.host, server.port)
    # a store no other process reaches, or none (MPI, NCCL): the watch meets elsewhere
    assert stall.tcp_under(dist.PrefixStore("x/", dist.HashStore())) is None
    assert stall.tcp_under(None) is None


def stop(child) -> str:
    """SIGSTOP ``child``; its state once the kernel has stopped it (or after 20 s)."""
    os.kill(child.pid, signal.SIGSTOP)
    for _ in range(400):  # a loaded machine may take a moment to deliver it
        if process_state(child.pid) == "T":
            break
        time.sleep(0.05)
    return process_state(child.pid)


def test_process_states_tell_stopped_from_running_and_dead():
    child = subprocess.Popen(["sleep", "30"])
    try:
        # "D": a process just started can be paging its program in; anything but stopped
        assert process_state(child.pid) in ("R", "S", "D")
        assert stop(child) == "T"
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) is None


def test_user_frames_are_neither_commrt_nor_torch_nor_the_standard_library():
    assert frames.is_user(__file__)
    assert not frames.is_user(stall.__file__)
    assert not frames.is_user(torch.__file__)
    assert not frames.is_user(json.__file__)
    assert not frames.is_user("<frozen importlib._bootstrap>")
    # an installed package's script is the user's, though site-packages lies in the
    # standard library's folder (a wrapper runs it through runpy); runpy itself is not
    import runpy
    import sysconfig

    purelib = sysconfig.get_paths()["purelib"]
    assert frames.is_user(os.path.join(purelib, "accelerate", "test_utils", "script.py"))
    assert not frames.is_user(runpy.__file__)


def _watch(store, rank, world_size=2):
    dep = types.SimpleNamespace(calls=3, sync_steps=0, in_sync=False, farewell_of=lambda r: None)
    return StallWatch(lambda: store, rank, world_size, Position(), dep, 2.0)


def test_the_judge_names_a_stopped_rank_from_its_heartbeat_and_its_process():
    store = dist.HashStore()
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert stop(child) == "T"
        judge = _watch(store, 0)
        judge.beat()
        # rank 1's last heartbeat, from a process that is now stopped on this host
        beat = {"beat": 1, "time": 0.0, "host": judge.host, "pid": child.pid, "position": {}}
        store.set("beat/1", json.dumps(beat))
        store.set("view/0", json.dumps(judge.hearing.view("test")))
        verdict = judge.hearing.judge_views(store)
    finally:
        child.kill()
        child.wait()
    assert verdict["root"] == 1 and verdict["kind"] == "stopped"
    assert [v["state"] for v in verdict["views"]] == ["published", "stopped"]
    assert verdict["views"][0]["stack"][-1][2] == "view"  # the main thread's own stack


def test_a_dropped_rank_is_reported_dropped():
    store = dist.HashStore()
    judge = _watch(store, 0)
    judge.drops(lambda: {1})
    judge.beat()
    store.set("view/0", json.dumps(judge.hearing.view("test")))
    verdict = judge.hearing.judge_views(store)
    assert verdict["views"][1]["state"] == "dropped" and verdict["kind"] == "none"


def test_a_rank_whose_watch_saw_the_stall_is_judged_from_its_view_though_it_comes_late(monkeypatch):
    """Issue 70's 13th run, its timing injected: rank 1 sits in its data loader, its watch
    beats (so it has seen the stall declared) but its view reaches the store only after
    the judge's :data:`~commrt.diagnosis.hearing.GATHER_S` (a loaded machine). Judged without
    its view, rank 1 was NOT ANSWERING on every rank, and no rank named the line it was
    stuck at; the judge now waits for a rank that beats."""
    monkeypatch.setattr(hearing, "GATHER_S", 2.0)
    store = dist.HashStore()
    judge = _watch(store, 0)
    judging, read = threading.Event(), hearing.read
    monkeypatch.setattr(hearing, "read", lambda s, key: judging.set() or read(s, key))
    waits = dict(CALL, in_call=True, step=0, peer=1)
    store.set("view/0", json.dumps(view(0, waits, [])))
    loader = [["train.py", 12, "load_next_batch", True]]

    def rank_1():  # beats every 0.2 s from the judge's start; its view after 3 s
        assert judging.wait(30)
        for n in range(15):
            beat = {"beat": n, "time": time.time(), "host": judge.host, "pid": os.getpid()}
            store.set("beat/1", json.dumps(beat | {"position": {}}))
            time.sleep(0.2)
        store.set("view/1", json.dumps(view(1, dict(CALL, in_call=False), loader)))

    late = threading.Thread(target=rank_1)
    late.start()
    verdict = judge.hearing.judge_views(store)
    late.join()
    assert verdict["views"][1]["state"] == "published", verdict["views"][1]
    assert (verdict["root"], verdict["kind"]) == (1, "user code"), verdict["lines"]


CALL = {"kind": "all_reduce", "algorithm": "ring", "numel": 8, "dtype": "float32", "seq": 5}


def view(rank: int, position: dict, stack: list) -> dict:
    return {"rank": rank, "host": "vm", "pid": 100 + rank, "state": "published",
            "position": position, "idle_s": 9.0, "stack": stack}  # fmt: skip


def test_the_docs_table_of_every_timeout_and_watch_setting_is_what_the_watch_does(monkeypatch):
    """docs/stalls.md's table, row by row, against stall_seconds and declares."""
    monkeypatch.delenv(settings.STALL.name, raising=False)
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "stalls.md")
    with open(docs) as f:
        text = f.read()
    table = text[text.index("### Every timeout and watch setting") :]
    lines = table.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[first + 2 : end]]
    assert len(rows) >= 8, rows
    for timeout, setting, said in rows:
        value = None if setting == "unset" else setting.strip("`")
        s = stall_seconds(value, float(timeout))
        if s is None:
            does = "never: no watch, no verdict"
        else:
            every = stall.declares(s, float(timeout))
            does = "at the timeout" if every is None else f"{every:g} s"
        assert does == said, (timeout, setting, said, does)
    assert f"up to {stall.GATHER_S:g} s for every rank" in " ".join(table.split())
    assert f"up to {stall.PRINTED_S:g} s for the others to print" in " ".join(table.split())


def test_a_broken_call_joins_a_stall_declared_a_moment_later_but_not_a_peers_death():
    """A peer that timed out closes the connection this rank waits on a moment before it
    declares the stall: the rank whose call broke waits for the declaration and joins
    the verdict (the error then carries it). A peer whose process is gone died: nothing
    is awaited, the error goes on at once, with no verdict."""
    store = dist.HashStore()
    watch = _watch(store, 1)
    joined = []
    watch.at_error = joined.append
    child = subprocess.Popen(["sleep", "30"])  # rank 0, alive on this host
    try:
        beat = {"beat": 1, "time": time.time(), "host": watch.host, "pid": child.pid}
        store.set("beat/0", json.dumps(beat))
        declare = threading.Timer(0.3, lambda: store.set("declared", "1"))
        declare.start()
        start = time.monotonic()
        watch.after_broken_call("broken", [0])
        assert joined == ["broken"] and 0.25 < time.monotonic() - start < stall.GATHER_S
    finally:
        child.kill()
        child.wait()
    # rank 0 is dead now: a death, never a stall's verdict; no wait
    start = time.monotonic()
    watch.after_broken_call("died", [0])
    assert joined == ["broken"] and time.monotonic() - start < 1.0
