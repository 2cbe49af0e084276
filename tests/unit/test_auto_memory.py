"""auto's memory of earlier jobs (commrt.tuning.memory): where it is, what it reads, when it
forgets. How a job uses it is tested with injected timings in test_auto_converges.py, and
across real ranks in tests/multiprocess/test_auto_memory_mp.py."""

import json
import logging
import time

import pytest

from commrt import settings
from commrt.tuning import memory as M
from commrt.tuning.memory import AutoMemory, Verdict, size_class

SHAPE = {"transport": "shm", "world_size": 2, "host": "h", "commrt": "0.1.0"}
LABELS = ("recursive_doubling", "ring", "halving_doubling")


def _mem(path, shape=SHAPE, writes=True):
    m = AutoMemory(dict(shape), None if path is None else str(path), writes=writes)
    m.verdicts = m.read()
    return m


def test_a_verdict_kept_is_read_by_the_next_job_of_the_same_shape_only(tmp_path):
    path = tmp_path / "sub" / "auto-memory.json"
    _mem(path).keep(4096, "ring", 20e-6, "recursive_doubling", 30e-6)
    assert _mem(path).recall(4096) == Verdict("ring", 20e-6, "recursive_doubling", 30e-6)
    assert _mem(path).recall(5000) == _mem(path).recall(4096)  # one size class
    assert _mem(path).recall(8192) is None
    for other in ({**SHAPE, "world_size": 4}, {**SHAPE, "transport": "gloo"}):
        assert _mem(path, other).recall(4096) is None
    _mem(path).keep(4096, "halving_doubling", 18e-6)  # a later verdict replaces it
    assert _mem(path).recall(4096) == Verdict("halving_doubling", 18e-6)
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_only_rank_0_writes_and_off_keeps_nothing(tmp_path, monkeypatch):
    path = tmp_path / "m.json"
    _mem(path, writes=False).keep(8, "ring", 1e-5)
    assert not path.exists()
    monkeypatch.setenv(settings.AUTO_MEMORY.name, "off")
    assert M.memory_path() is None
    off = _mem(None)
    off.keep(8, "ring", 1e-5)
    assert off.read() == {} and off.recall(8) is None
    monkeypatch.setenv(settings.AUTO_MEMORY.name, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert M.memory_path() == str(tmp_path / "cache" / "commrt" / "auto-memory.json")


def test_old_entries_are_forgotten_and_the_file_stays_bounded(tmp_path, monkeypatch):
    path = tmp_path / "m.json"
    m = _mem(path)
    m.keep(8, "ring", 1e-5)
    entries = json.loads(path.read_text())["entries"]
    entries[0]["at"] = time.time() - M.MAX_AGE_S - 1
    path.write_text(json.dumps({"entries": entries}))
    assert _mem(path).recall(8) is None
    monkeypatch.setattr(M, "MAX_ENTRIES", 3)
    for k in range(6):
        m.keep(1 << k, "ring", 1e-5)
    kept = json.loads(path.read_text())["entries"]
    assert [e["class"] for e in kept] == [size_class(1 << k) for k in (3, 4, 5)]


@pytest.mark.parametrize("content", ["{not json", '{"entries": 3}', "[]", ""])
def test_a_broken_file_is_warned_about_once_and_then_written_anew(tmp_path, caplog, content):
    path = tmp_path / "m.json"
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="commrt.tuning.memory"):
        m = _mem(path)
        assert m.verdicts == {}
        m.keep(8, "ring", 1e-5)
        m.keep(16, "ring", 1e-5)
    warned = [r for r in caplog.records if "could not be" in r.getMessage()]
    assert len(warned) == 1 and str(path) in warned[0].getMessage()
    assert _mem(path).recall(16) == Verdict("ring", 1e-5)  # written anew


def test_a_folder_that_cannot_be_written_is_warned_about_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="commrt.tuning.memory"):
        _mem(blocker / "m.json").keep(8, "ring", 1e-5)
    assert any("could not be" in r.getMessage() for r in caplog.records)


def test_the_row_every_rank_shares_carries_every_verdict():
    m = AutoMemory(SHAPE, None, writes=False)
    m.verdicts = {
        size_class(8): Verdict("ring", 2e-5, "recursive_doubling", 3e-5, 7e-5, 4e-4),
        size_class(4096): Verdict("ring", 3e-5, None, None, 0.0),  # measured: nothing more
        size_class(1 << 24): Verdict("halving_doubling", 4e-3),
        size_class(64): Verdict("torus2d(2x2)", 1e-4),  # not a candidate here: left out
    }
    row = m.encode(LABELS)
    assert len(row) == M.FIELDS * M.CLASSES
    back = AutoMemory.decode(row, LABELS)
    assert back == {k: v for k, v in m.verdicts.items() if v.kept in LABELS}
    assert AutoMemory.decode([M.NONE] * (M.FIELDS * M.CLASSES), LABELS) == {}


def test_what_learning_cost_is_kept_beside_the_verdict_and_older_entries_still_read(tmp_path):
    path = tmp_path / "m.json"
    _mem(path).keep(8, "ring", 2e-5, "recursive_doubling", 3e-5, 7e-5, 4e-4)
    assert _mem(path).recall(8) == Verdict("ring", 2e-5, "recursive_doubling", 3e-5, 7e-5, 4e-4)
    entries = json.loads(path.read_text())["entries"]
    for e in entries:  # as a commrt that measured no cost wrote it
        del e["learn_call_s"], e["gather_s"]
    path.write_text(json.dumps({"entries": entries}))
    assert _mem(path).recall(8) == Verdict("ring", 2e-5, "recursive_doubling", 3e-5)
