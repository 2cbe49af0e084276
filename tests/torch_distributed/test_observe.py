"""Seeing what commrt did under DDP: stats, the COMMRT_LOG line, the COMMRT_TRACE files.

One 2-rank torchrun job trains a small MLP with DDP on backend "commrt" and the
default algorithm (auto), with buckets small enough that DDP makes two of
different sizes after its first step; each of the three ways must show, for every
bucket size, the schedule auto chose (``auto:<choice>``).
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist
from helpers.cli import run_commrt

import commrt  # noqa: F401  (registers the backend)
from commrt.distributed import observe
from commrt.process.environment import log_level

# one worker runs the whole module under pytest-xdist: its tests read one started torchrun
# job (a module fixture)
pytestmark = pytest.mark.xdist_group("test_observe")

STEPS = 6
#: DDP's buckets for bucket_cap_mb=0.002 (2097 B): the last layer's weight and bias, then
#: the first layer's (a bucket closes once it reaches the cap); before the first step's
#: rebuild, one bucket of every gradient
BUCKETS = (2600, 8448)
ALL = 11048
SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
import commrt
dist.init_process_group("commrt")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
)
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.002)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(int(sys.argv[2])):
    ddp(torch.randn(8, 32)).sum().backward()
    opt.step()
    opt.zero_grad()
peer = 1 - dist.get_rank()  # pipelining's calls: sends and receives, counted too
for _ in range(3):
    t = torch.arange(100, dtype=torch.float32)
    dist.send(t, peer) if dist.get_rank() == 0 else dist.recv(t, peer)
s = commrt.distributed.stats()
rows = [dict(op=e.op, nbytes=e.nbytes, calls=e.calls, algorithm=e.algorithm,
             ran=e.ran, why=e.why, seconds=e.seconds, learning=e.learning)
        for e in s.entries.values()]
out = dict(rows=rows, algorithms=s.algorithms, transports=s.transports, text=str(s))
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The job's per-rank stats, its stderr, and its trace folder."""
    tmp = tmp_path_factory.mktemp("observe")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(_port()), str(script), str(tmp), str(STEPS)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMRT_", "TORCH_DIST"))}
    env.update(OMP_NUM_THREADS="1", COMMRT_LOG="info", COMMRT_TRACE=str(tmp / "trace"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp / f"{r}.json").read_text()) for r in range(2)]
    return ranks, proc.stderr, tmp / "trace"


def _allreduces(rows):
    return {r["nbytes"]: r for r in rows if r["op"] == "allreduce(sum)"}


def test_stats_name_autos_choice_and_why_for_every_bucket(job):
    ranks, _, _ = job
    for stats in ranks:
        seen = _allreduces(stats["rows"])
        assert set(seen) == {ALL, *BUCKETS}
        assert seen[ALL]["calls"] == 1  # the first step, before DDP rebuilt its buckets
        for nbytes in BUCKETS:
            row = seen[nbytes]
            assert row["calls"] == STEPS - 1 and row["seconds"] > 0
            assert row["algorithm"].startswith("auto:"), row
            assert sum(row["ran"].values()) == STEPS - 1
            # settled: auto:<kept> and its choice's line; still learning, what it runs
            # meanwhile, and the note says so: the two never disagree
            label, learning = row["algorithm"][len("auto:") :], row["learning"]
            assert row["why"].startswith("auto: "), row
            assert f" for {nbytes} B on 2 ranks" in row["why"] and "predicted" in row["why"]
            said = f"runs {label} meanwhile" if learning else f"auto: {label} for"
            assert said in row["why"] and row["why"].startswith("auto: learning") == learning
        assert stats["algorithms"] and all(
            a.startswith("auto:") for r in seen.values() for a in r["ran"]
        )
        # the printed table names every bucket's choice and fits a terminal
        assert "auto:" in stats["text"] and max(map(len, stats["text"].splitlines())) <= 80
        # torchrun on one host: the CPU calls went through shared memory, and say so
        assert stats["transports"] == ["shm"] and " over shm\n" in stats["text"]
    # auto's choices are agreed: both ranks ran the same schedules
    ran = [[_allreduces(r["rows"])[n]["ran"] for n in BUCKETS] for r in ranks]
    assert ran[0] == ran[1]


def test_stats_count_sends_and_receives_beside_the_collectives(job):
    ranks, _, _ = job
    for rank, stats in enumerate(ranks):
        op = "send" if rank == 0 else "recv"
        (row,) = [r for r in stats["rows"] if r["op"] == op]
        assert row["nbytes"] == 400 and row["calls"] == 3 and row["seconds"] > 0, row
        assert row["algorithm"] == "" and f"\n{op} " in stats["text"], stats["text"]


def test_log_says_each_size_once_on_rank_0_with_autos_reason(job):
    ranks, err, _ = job
    lines = err.splitlines()
    for nbytes in (ALL, *BUCKETS):
        head = f"commrt: allreduce(sum) of {nbytes} B float32 on 2 ranks: auto:"
        said = [i for i, line in enumerate(lines) if line.startswith(head)]
        assert len(said) == 1, (nbytes, err[-3000:])  # once, by rank 0 alone
        # the first call: auto is learning, and runs the model's choice meanwhile
        chosen = lines[said[0]][len(head) :]
        note = " ".join(x.strip() for x in lines[said[0] + 1 : said[0] + 4])
        assert note.startswith(f"auto: learning for {nbytes} B on 2 ranks; runs {chosen} ")
        first = _allreduces(ranks[0]["rows"])[nbytes]["ran"]
        assert f"auto:{chosen}" == next(iter(first))  # the log named what ran first
    ours = [line for line in lines if line.startswith(("commrt", "  auto", "    "))]
    assert ours and max(map(len, ours)) <= 80


def test_trace_per_rank_shows_autos_choice_and_merges(job, tmp_path):
    ranks, _, folder = job
    paths = [folder / f"rank{r}.json" for r in range(2)]
    for r, path in enumerate(paths):
        events = json.loads(path.read_text())["traceEvents"]
        calls = [e for e in events if e["name"] == "commrt/allreduce(sum)"]
        assert len(calls) == 1 + 2 * (STEPS - 1)
        assert {e["args"]["bytes"] for e in calls} == {ALL, *BUCKETS}
        for e in calls:
            assert e["pid"] == r and e["args"]["algorithm"].startswith("auto:")
        # the schedule's steps, named after auto's choice, inside the calls
        ran = {a for row in _allreduces(ranks[r]["rows"]).values() for a in row["ran"]}
        steps = {e["name"].split("/")[1] for e in events if e["name"].startswith("commrt/auto:")}
        assert steps == ran
    merged = tmp_path / "merged.json"
    proc = run_commrt("trace", "merge", "-o", str(merged), *map(str, paths))
    assert proc.returncode == 0, proc.stderr
    pids = {e["pid"] for e in json.loads(merged.read_text())["traceEvents"]}
    assert pids == {0, 1}


# ------------------------------------------------------------------ without processes


@pytest.mark.parametrize(
    "env, level",
    [
        ({}, "off"),
        ({"COMMRT_LOG": "info"}, "info"),
        ({"COMMRT_LOG": "DEBUG"}, "debug"),
        ({"COMMRT_LOG": "0"}, "off"),
        ({"TORCH_DISTRIBUTED_DEBUG": "INFO"}, "info"),
        ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "info"),
        ({"TORCH_DISTRIBUTED_DEBUG": "OFF"}, "off"),
        ({"TORCH_DISTRIBUTED_DEBUG": "INFO", "COMMRT_LOG": "off"}, "off"),
    ],
)
def test_log_level_from_the_environment(env, level, monkeypatch):
    for k in ("COMMRT_LOG", "TORCH_DISTRIBUTED_DEBUG"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert log_level() == level


def test_who_speaks_info_rank_0_debug_every_rank(monkeypatch):
    monkeypatch.setenv("COMMRT_LOG", "info")
    assert [observe.Observer(r, 2, "0", None).speaks for r in range(2)] == [True, False]
    monkeypatch.setenv("COMMRT_LOG", "debug")
    assert [observe.Observer(r, 2, "0", None).speaks for r in range(2)] == [True, True]


def _world_of_one(tmp_path):
    dist.init_process_group(
        "commrt", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )


def test_a_bad_commrt_log_is_refused_at_init_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRT_LOG", "verbose")
    with pytest.raises(ValueError, match="COMMRT_LOG='verbose'"):
        _world_of_one(tmp_path)


def test_stats_of_the_default_group_and_refusal_of_another_backend(tmp_path, monkeypatch):
    monkeypatch.delenv("COMMRT_LOG", raising=False)
    _world_of_one(tmp_path)
    try:
        import torch

        dist.all_reduce(torch.ones(5))
        dist.barrier()
        s = commrt.distributed.stats()
        assert s is commrt.distributed.stats(dist.group.WORLD)
        ops = {(e.op, e.nbytes, e.calls) for e in s.entries.values()}
        assert ("allreduce(sum)", 20, 1) in ops and ("barrier", 0, 1) in ops
        gloo = dist.new_group(backend="gloo")
        with pytest.raises(ValueError, match="not on commrt"):
            commrt.distributed.stats(gloo)
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="init_process_group"):
        commrt.distributed.stats()


def test_the_time_a_call_leaves_out_the_first_call():
    e = observe.CallStats("allreduce(sum)", 8, "float32", calls=3, seconds=1.3, first_seconds=1.0)
    assert abs(e.per_call_s - 0.15) < 1e-12 and e.bytes == 24
    alone = observe.CallStats("barrier", 0, "-", calls=1, seconds=0.2, first_seconds=0.2)
    assert alone.per_call_s == 0.2


def test_a_lone_first_call_is_marked_as_including_its_set_up():
    """A row of one call shows that call's time, set-up included: the table marks it and
    says so; sizes are in the one unit system (binary: KiB); the text ends a line."""
    s = observe.GroupStats(0, 2, "0")
    lone = observe.CallStats("broadcast", 11264, "float32", transport="shm")
    lone.count(0.781504)
    many = observe.CallStats("allreduce(sum)", 2600, "float32", algorithm="ring")
    for seconds in [0.5] + [0.000382] * 18:
        many.count(seconds)
    s.entries = {"a": lone, "b": many}
    text = str(s)
    rows = {line.split()[0]: line for line in text.splitlines()}
    assert "781.504*" in rows["broadcast"] and rows["allreduce(sum)"].endswith(" 0.382   ring")
    assert "* one call only: its time includes its set-up" in text
    assert "11 KiB" in rows["broadcast"] and "2.539 KiB" in rows["allreduce(sum)"]
    assert text.endswith("\n") and not text.endswith("\n\n")
    s.entries = {"b": many}
    assert "one call only" not in str(s) and str(s).endswith(" 0.382  ring\n")  # no pad


def test_a_trace_folder_it_cannot_make_is_refused_at_init_naming_it(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("COMMRT_TRACE", str(blocker / "traces"))
    with pytest.raises(ValueError, match="COMMRT_TRACE=.*: cannot make that folder"):
        _world_of_one(tmp_path)


def test_a_trace_folder_it_cannot_write_is_refused_at_init_naming_it(tmp_path, monkeypatch):
    # root may write anywhere, so the permission is denied by hand, for that folder only
    folder = tmp_path / "traces"
    monkeypatch.setenv("COMMRT_TRACE", str(folder))
    real = observe.os.access
    monkeypatch.setattr(
        observe.os, "access", lambda p, mode: False if str(p) == str(folder) else real(p, mode)
    )
    with pytest.raises(ValueError, match="COMMRT_TRACE=.*: this process cannot write there"):
        _world_of_one(tmp_path)
