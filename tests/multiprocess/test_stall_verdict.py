"""When a 4-rank gloo job stalls, every live rank prints the same verdict naming
the root cause, and every process ends (tests/workers/verdict_worker.py).

The stall watch is 2 s here (COMMRT_STALL_S). Where a verdict is printed, every process
must have ended within the stall watch plus :data:`VERDICT_WITHIN_S` of the moment the
culprit stalled (it prints "stall from <time>"), as docs/stalls.md promises; each job also gets
a generous bound, and a rank that had to be killed at that bound fails the test.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

import pytest
from helpers.mp import TESTS, GlooJob, mpiexec

STALL_S = "2"
#: seconds the job gets before its ranks are killed (a loaded 2-core machine starts 4 torch
#: processes slowly); a verdict needs the stall watch plus about 5 s
BOUND_S = 120
VERDICT = "commrt stall verdict (the same on every rank):"
#: seconds past the stall watch by which every process of a stalled job has ended
VERDICT_WITHIN_S = 10


def line_of(script: str, text: str) -> int:
    """The line of ``tests/workers/<script>`` that holds ``text``."""
    with open(os.path.join(TESTS, "workers", script)) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


#: where load_next_batch hangs in the gloo/MPI worker
HANG = f"verdict_worker.py:{line_of('verdict_worker.py', 'a data loader that hangs')} in load_next_batch"


def run(
    case: str, tmp_path, culprit_stops: bool = False, script: str = "verdict_worker.py",
    backend: str = "gloo", watch_s: float = float(STALL_S), before: tuple = (),
    stall_s: str = STALL_S,
):  # fmt: skip
    """Run the case; return (exit codes, outputs, dump folder). A rank that stopped itself
    is killed once the others ended (as a launcher would). ``watch_s``: the stall watch,
    or the timeout where that watch is the default (:data:`TIMEOUT_S`). ``before``:
    arguments before the case's (a wrapper's). ``stall_s``: ``COMMRT_STALL_S`` where the
    watch is not the default."""
    dump = tmp_path / f"dump-{case}"
    env = {"COMMRT_DUMP": str(dump)} | TIMEOUT_ENV
    default = watch_s != float(STALL_S)  # the default watch: COMMRT_STALL_S unset
    env |= {} if default else {"COMMRT_STALL_S": stall_s}
    job = GlooJob(
        script, [*before, case, backend], 4, env=env, drop_env=["COMMRT_STALL_S"] * default
    )
    for r in range(4):
        job.start(r)
    live = job.procs[:3] if culprit_stops else job.procs
    outs, killed, culprit_out = [], [], ""
    try:
        for p in live:
            try:
                outs.append(p.communicate(timeout=BOUND_S)[0])
            except subprocess.TimeoutExpired:
                killed.append(job.procs.index(p))
                p.kill()
                outs.append(p.communicate()[0])
        ended = time.time()
    finally:
        for p in job.procs:
            if p.poll() is None:
                p.kill()
        if culprit_stops:
            culprit_out = job.procs[3].communicate()[0]
    assert not killed, f"ranks {killed} outlived the stall:\n" + "\n".join(outs)
    if any(VERDICT in o for o in outs):
        began = [float(x) for x in re.findall(r"stall from ([\d.]+)", "".join(outs) + culprit_out)]
        assert began, "the culprit never said when it stalled:\n" + "\n".join(outs)
        took = ended - min(began)
        assert took <= watch_s + VERDICT_WITHIN_S, f"every rank ended {took:.1f} s after the stall"
    return [p.returncode for p in live], outs, dump


def verdict_of(out: str) -> str:
    """The verdict's lines in ``out``: from its head to its "next:" paragraph's end."""
    assert VERDICT in out, out
    lines = out[out.index(VERDICT) :].splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("next:"))
    while end + 1 < len(lines) and lines[end + 1].startswith("    "):
        end += 1
    return "\n".join(lines[: end + 1])


#: what a rank prints where the verdict's full text is elsewhere: another rank of its
#: host prints it, or the error this rank raises carries it
POINTER = re.compile(r"commrt: rank (\d+): stall verdict \(([^)]*)\): (.*)")


def told(out: str) -> bool:
    """Whether ``out`` has the verdict: in full, or the one line that points to it."""
    return VERDICT in out or POINTER.search(out) is not None


def one_verdict(outs) -> str:
    """The verdict of the job's outputs (one host: one rank prints it in full, the others a
    line that points to it and names the same root cause), its lines joined by spaces
    (the text wraps at 80 columns)."""
    verdicts = {verdict_of(o) for o in outs if VERDICT in o}
    assert len(verdicts) == 1, "\n----\n".join(verdicts) or "\n----\n".join(outs)
    v = " ".join(verdicts.pop().split())
    root = re.search(r"root cause: (rank \d+) ", v)
    for out in outs:
        if VERDICT not in out:
            said = POINTER.search(" ".join(out.split()))
            assert said and said.group(3).startswith(root.group(1) + " "), out
    return v


def test_a_rank_in_user_code_is_named_with_load_next_batch_and_its_line(tmp_path):
    codes, outs, dump = run("user", tmp_path)
    assert codes == [1, 1, 1, 1]
    v = one_verdict(outs)
    assert "rank 3 " in v and "IN USER CODE" in v
    assert HANG in v, v
    assert "waiting for it: ranks 0-2, in all_reduce" in v
    # the post-mortem: commrt diagnose prints the same verdict from the files alone
    cmd = [sys.executable, "-m", "commrt", "diagnose", str(dump)]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert " ".join(again.stdout.split()).startswith(v), again.stdout
    assert sorted(os.listdir(dump)) == [f"rank{r}.json" for r in range(4)]


def test_ranks_in_a_barrier_wait_on_the_rank_in_user_code(tmp_path):
    codes, outs, _ = run("barrier", tmp_path)
    assert codes == [1, 1, 1, 1]
    v = one_verdict(outs)
    assert "rank 3 " in v and "IN USER CODE" in v and HANG in v, v
    assert "waiting for it: ranks 0-2, in barrier" in v


@pytest.mark.slow
def test_a_stopped_rank_is_named_stopped(tmp_path):
    codes, outs, _ = run("stop", tmp_path, culprit_stops=True)
    assert codes == [1, 1, 1]
    v = one_verdict(outs)
    assert "rank 3 " in v and "STOPPED (SIGSTOP)" in v and "ranks 0-2" in v


def test_a_killed_rank_is_named_dead(tmp_path):
    codes, outs, dump = run("kill", tmp_path)
    assert codes[:3] == [1, 1, 1] and codes[3] == -signal.SIGKILL
    v = one_verdict(outs[:3])
    assert "rank 3 " in v and "DEAD" in v and "ranks 0-2" in v
    # each survivor's dump ends where the verdict saw it, not at its last beat's sample
    # (the death is seen within milliseconds of the last call, between two beats)
    for r in range(3):
        data = json.loads((dump / f"rank{r}.json").read_text())
        (seen,) = [x["position"] for x in data["verdict"]["views"] if x["rank"] == r]
        assert data["positions"][-1]["seq"] == seen["seq"], (data["positions"], seen)


def test_a_rank_in_another_collective_is_named_beside_the_others_call(tmp_path):
    codes, outs, _ = run("other", tmp_path)
    assert codes == [1, 1, 1, 1]
    v = one_verdict(outs)
    assert "rank 2 " in v and "IN ANOTHER COLLECTIVE" in v
    assert "broadcast (" in v and "on rank 2, while ranks 0,1,3 are in all_reduce (ring" in v


@pytest.mark.slow
def test_a_chain_of_waits_is_followed_to_its_root(tmp_path):
    codes, outs, _ = run("chain", tmp_path)
    assert codes == [1, 1, 1, 1]
    v = one_verdict(outs)
    assert "rank 3 " in v and "IN USER CODE" in v and "load_next_batch" in v
    assert "chain of waits: rank 0 -> rank 1 -> rank 2 -> rank 3" in v


@pytest.mark.slow
def test_ranks_merely_slower_than_each_other_are_never_blamed(tmp_path):
    codes, outs, dump = run("slow", tmp_path)
    assert codes == [0, 0, 0, 0], "\n".join(outs)
    assert not any(VERDICT in o for o in outs)
    assert all("finished" in o for o in outs)
    assert not dump.exists()


@pytest.mark.slow
def test_under_ddp_on_backend_commrt_the_rank_in_its_data_loader_is_named(tmp_path):
    codes, outs, _ = run("ddp", tmp_path, script="verdict_ddp_worker.py")
    assert codes == [1, 1, 1, 1]
    v = one_verdict(outs)
    hang = line_of("verdict_ddp_worker.py", "a data loader that hangs")
    assert "rank 3 " in v and f"verdict_ddp_worker.py:{hang} in load_next_batch" in v, v
    assert "torch allreduce(sum)" in v and "waiting for it: ranks 0-2" in v


@pytest.mark.slow
def test_under_gradientsync_the_verdict_names_the_step_and_the_culprit(tmp_path):
    codes, outs, _ = run("ring", tmp_path, script="verdict_sync_worker.py")
    assert codes == [1, 1, 1, 1]
    v = one_verdict(outs)
    # the culprit hangs in its loop's step 2: the verdict counts GradientSync steps as the
    # loop does, from 0
    assert "rank 3 " in v and "in load_next_batch" in v and "GradientSync step 2," in v, v


@pytest.mark.parametrize("case,stall_s", [("late", STALL_S), ("dead", "6")])
@pytest.mark.slow
def test_under_backup_workers_a_late_or_dead_rank_is_dropped_not_blamed(case, stall_s, tmp_path):
    """A dead rank is dropped once recorded dead (dead_after_s, 2 s in the worker), so the
    watch of that case is well above it: at 2 s, the live ranks' ordinary waits for each
    other around the drop and in close() reached it on a loaded CI machine."""
    codes, outs, dump = run(case, tmp_path, script="verdict_sync_worker.py", stall_s=stall_s)
    assert codes[:3] == [0, 0, 0], "\n".join(outs)
    assert codes[3] == (0 if case == "late" else -signal.SIGKILL)
    assert not any(VERDICT in o for o in outs) and not dump.exists()
    assert all("finished" in o for o in outs[:3])


# -- over MPI: one output stream for the job (mpiexec's); the mpich wheel kills every rank
# when one dies, so the dead-rank case is gloo's alone (above)


@pytest.mark.parametrize(
    "case, live, named",
    [
        ("user", 4, ["rank 3 ", "IN USER CODE", HANG]),
        ("stop", 3, ["rank 3 ", "STOPPED (SIGSTOP)"]),
        ("other", 4, ["rank 2 ", "IN ANOTHER COLLECTIVE", "broadcast ("]),
        ("chain", 4, ["rank 3 ", "chain of waits: rank 0 -> rank 1 -> rank 2 -> rank 3"]),
    ],
)
@pytest.mark.slow
def test_over_mpi_every_live_rank_prints_the_same_verdict(case, live, named):
    proc = mpiexec(4, "verdict_worker.py", case, "mpi", timeout=BOUND_S, check=False,
                   env={"COMMRT_STALL_S": STALL_S})  # fmt: skip
    ended, out = time.time(), proc.stdout + proc.stderr
    assert proc.returncode != 0 and "finished" not in out, out
    assert out.count(VERDICT) == 1 and len(POINTER.findall(out)) == live - 1, out
    took = ended - float(re.search(r"stall from ([\d.]+)", out).group(1))
    assert took <= float(STALL_S) + VERDICT_WITHIN_S, f"the job ended {took:.1f} s after the stall"
    causes = {line for line in out.splitlines() if line.startswith("root cause:")}
    assert len(causes) == 1, causes
    flat = " ".join(out.split())
    for text in named:
        assert text in flat, out


# -- a timeout within the default watch: the verdict forms at the timeout, in the error

#: the timeout of the cases that stall within the default watch (VERDICT_TIMEOUT_S, which
#: both workers read): the default watch (60 s) is longer, so the timeout declares the
#: stall; short, as the wait is all these tests spend their time on
TIMEOUT_S = 6
TIMEOUT_ENV = {"VERDICT_TIMEOUT_S": str(TIMEOUT_S)}


@pytest.mark.parametrize("backend", ["gloo", "shm"])
@pytest.mark.parametrize("case", ["timeout", "caught"])
@pytest.mark.slow
def test_a_timeout_within_the_default_watch_still_names_the_rank_and_line(case, backend, tmp_path):
    codes, outs, _ = run(case, tmp_path, backend=backend, watch_s=TIMEOUT_S)
    assert all(c != 0 for c in codes), "\n".join(outs)
    for out in outs:  # every rank's output has it: printed, or in the error it raised
        flat = " ".join(out.split())
        assert told(out) and "rank 3 " in flat and "IN USER CODE" in flat, out
        assert HANG in flat, out
    if case == "caught":  # the error each rank caught carried the verdict
        caught = [o for o in outs if "caught: commrt: rank" in o]
        assert all(VERDICT in o[o.index("caught: ") :] for o in caught), caught


# -- launched from the environment, as users launch: rank 0 hosts the store, every rank
# catches its timeout, prints it and leaves with os._exit at once. Rank 0's exit takes the
# store with it, and under MPI any rank's exit makes mpiexec kill the others: every rank
# must have its verdict out before any rank can leave

#: runs per backend (the ranks race each other's exits, so one run proves little); the
#: first over gloo runs in the inner loop (-m "not slow")
CAUGHT_RUNS = 5


def by_rank(out: str, n: int) -> list[str]:
    """mpiexec's merged output (``-prepend-rank``: each line begins ``[r] ``), per rank."""
    lines = [re.match(r"\[(\d+)\] ?(.*)", line) for line in out.splitlines()]
    return ["\n".join(m.group(2) for m in lines if m and m.group(1) == str(r)) for r in range(n)]


def assert_every_rank_names_the_culprit(outs: list[str]) -> None:
    """Each rank's own output names rank 3 in its data loader, at its line; no rank's
    output blames another rank, nor lacks the verdict."""
    for rank, out in enumerate(outs):
        flat = " ".join(out.split())
        assert "no stall verdict" not in flat, f"rank {rank}:\n{out}"
        assert told(out) and "rank 3 " in flat and "IN USER CODE" in flat, f"rank {rank}:\n{out}"
        assert HANG in flat, f"rank {rank}:\n{out}"
        causes = set(re.findall(r"root cause: rank (\d+)", flat))
        causes |= set(re.findall(r"stall verdict \([^)]*\): rank (\d+)", flat))
        assert causes == {"3"}, f"rank {rank} blames {causes}:\n{out}"


@pytest.mark.parametrize(
    "backend, run_index",
    [
        pytest.param(b, i, marks=[pytest.mark.slow] if i or b != "gloo" else [])
        for b in ("gloo", "shm", "mpi")
        for i in range(CAUGHT_RUNS)
    ],
)
def test_with_rank_0_hosting_the_store_every_rank_that_caught_its_timeout_names_the_culprit(
    backend, run_index
):
    env = dict(TIMEOUT_ENV)
    if backend == "mpi":
        proc = mpiexec(4, "verdict_worker.py", "caught", "mpi", timeout=BOUND_S, check=False,
                       env=env | {"COMMRT_STALL_S": ""}, flags=["-prepend-rank"])  # fmt: skip
        outs = by_rank(proc.stdout + proc.stderr, 4)
        assert proc.returncode != 0, proc.stdout + proc.stderr
    else:
        job = GlooJob("verdict_worker.py", ["caught", backend], 4, env=env,
                      drop_env=["COMMRT_STALL_S"], rank0_hosts=True)  # fmt: skip
        for r in range(4):
            job.start(r)
        codes, outs = job.finish(BOUND_S)
        assert all(c > 0 for c in codes), (codes, outs)  # none killed at the bound
    assert_every_rank_names_the_culprit(outs)


@pytest.mark.slow
def test_a_timeout_within_the_default_watch_under_ddp_names_the_rank_and_line(tmp_path):
    codes, outs, _ = run("timeout", tmp_path, script="verdict_ddp_worker.py", watch_s=TIMEOUT_S)
    assert all(c != 0 for c in codes), "\n".join(outs)
    hang = line_of("verdict_ddp_worker.py", "a data loader that hangs")
    for out in outs:
        flat = " ".join(out.split())
        assert told(out) and "rank 3 " in flat and "IN USER CODE" in flat, out
        assert f"verdict_ddp_worker.py:{hang} in load_next_batch" in flat, out


@pytest.mark.slow
def test_under_torchrun_a_timeout_within_the_default_watch_names_the_rank_and_line():
    """torchrun itself, DDP on backend commrt: the first rank that ends after its timeout
    makes torchrun stop the others, so the job's merged output (not each rank's) must name
    the rank in its data loader and the line."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    cmd += ["--standalone", os.path.join(TESTS, "workers", "verdict_ddp_worker.py")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMRT_", "TORCH_DIST"))}
    env.update(OMP_NUM_THREADS="1", **TIMEOUT_ENV)
    proc = subprocess.run(
        [*cmd, "timeout"], env=env, capture_output=True, text=True, timeout=BOUND_S + TIMEOUT_S
    )
    ended, out = time.time(), proc.stdout + proc.stderr
    assert proc.returncode != 0 and "finished" not in out, out
    took = ended - float(re.search(r"stall from ([\d.]+)", out).group(1))
    assert took <= TIMEOUT_S + VERDICT_WITHIN_S, f"the job ended {took:.1f} s after the stall"
    hang = line_of("verdict_ddp_worker.py", "a data loader that hangs")
    flat = " ".join(out.split())
    assert told(out) and "rank 3 " in flat and "IN USER CODE" in flat, out
    assert f"verdict_ddp_worker.py:{hang} in load_next_batch" in flat, out
    # the block, printed within an error's text, keeps its lines within 80 columns (but for
    # a file's path longer than that, which stays whole on a line of its own)
    block = verdict_of(out).splitlines()
    assert all(len(line) <= 80 or " " not in line.strip() for line in block), block
    # torchrun's own summary names the same root cause: its error file holds the verdict
    root = out[out.index("Root Cause (first observed failure):") :]
    assert "root cause: rank 3 (host" in root and "IN USER CODE" in root, root


@pytest.mark.slow
def test_over_mpi_a_timeout_within_the_default_watch_names_the_rank_and_line():
    proc = mpiexec(4, "verdict_worker.py", "timeout", "mpi", timeout=BOUND_S, check=False,
                   env={"COMMRT_STALL_S": ""} | TIMEOUT_ENV)  # fmt: skip
    ended, out = time.time(), proc.stdout + proc.stderr
    assert proc.returncode != 0 and "finished" not in out, out
    took = ended - float(re.search(r"stall from ([\d.]+)", out).group(1))
    assert took <= TIMEOUT_S + VERDICT_WITHIN_S, f"the job ended {took:.1f} s after the stall"
    flat = " ".join(out.split())
    assert VERDICT in out and "rank 3 " in flat and HANG in flat, out


# -- a size mismatch after the first agreed call: rank 1 is in its call's first-use check


def assert_sizes_named(v: str) -> None:
    assert "rank 1 " in v and "IN ANOTHER COLLECTIVE" in v and "IN USER CODE" not in v, v
    assert "999 × float32" in v and "on rank 1," in v, v
    assert "while ranks 0,2,3 are in all_reduce (" in v and "1000 × float32" in v, v


@pytest.mark.parametrize(
    "script, backend",
    [
        pytest.param("verdict_worker.py", "gloo", marks=pytest.mark.slow),
        ("verdict_worker.py", "shm"),
        pytest.param("verdict_ddp_worker.py", "-", marks=pytest.mark.slow),
    ],
)
def test_a_size_mismatch_after_agreed_calls_is_another_collective(script, backend, tmp_path):
    codes, outs, _ = run("size", tmp_path, script=script, backend=backend)
    assert all(c != 0 for c in codes), "\n".join(outs)
    assert_sizes_named(one_verdict(outs))


def test_over_mpi_a_size_mismatch_is_another_collective():
    proc = mpiexec(4, "verdict_worker.py", "size", "mpi", timeout=BOUND_S, check=False,
                   env={"COMMRT_STALL_S": STALL_S})  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count(VERDICT) == 1, out
    assert_sizes_named(" ".join(verdict_of(out).split()))


# -- user code inside site-packages, run through runpy


@pytest.fixture
def installed_script():
    """verdict_worker.py copied into this interpreter's site-packages (as an installed
    package's script is), removed after."""
    folder = os.path.join(sysconfig.get_paths()["purelib"], f"_commrt_stall_test_{os.getpid()}")
    os.makedirs(folder)
    try:
        yield shutil.copy(os.path.join(TESTS, "workers", "verdict_worker.py"), folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def assert_own_line_named(v: str, installed_script: str) -> None:
    """The verdict ``v`` names the installed script's own line, not runpy's."""
    at = v[v.index(", at: ") :]
    assert at.startswith(", at: ") and HANG in at.split(" main ")[0], v
    assert os.path.basename(os.path.dirname(installed_script)) in at.split(" in ")[0], v
    assert "runpy" not in at.split("waiting for it")[0].replace("innermost", ""), v


@pytest.mark.parametrize("backend", [pytest.param("gloo", marks=pytest.mark.slow), "shm"])
def test_a_script_in_site_packages_run_through_runpy_is_named_by_its_own_line(
    backend, installed_script, tmp_path
):
    codes, outs, _ = run(
        "user", tmp_path, script="runpy_wrapper.py", backend=backend, before=(installed_script,)
    )
    assert codes == [1, 1, 1, 1], "\n".join(outs)
    assert_own_line_named(one_verdict(outs), installed_script)


def test_over_mpi_a_script_in_site_packages_is_named_by_its_own_line(installed_script):
    proc = mpiexec(4, "runpy_wrapper.py", installed_script, "user", "mpi", timeout=BOUND_S,
                   check=False, env={"COMMRT_STALL_S": STALL_S})  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count(VERDICT) == 1, out
    assert_own_line_named(" ".join(verdict_of(out).split()), installed_script)


# -- a rank SIGKILLed under DDP: every survivor names that rank, never one that left after it

#: runs of the killed-rank job over shared memory (the issue's count): the ranks that see the
#: death first race those that see a survivor leave, so one run proves little
KILL_RUNS = 10
#: what names a rank as gone, dead, or where a failure began
NAMED_GONE = (
    r"rank (\d+)'s process \(pid \d+\) is gone",
    r"rank (\d+) \(host [^)]*\) is DEAD",
    r"also: rank (\d+) is dead",
    r"a failure that began at rank (\d+)",
)


def killed_job(transport: str) -> list[str]:
    """One DDP job whose rank 2 SIGKILLs itself at step 3; the survivors' outputs."""
    env = {"COMMRT_CPU_TRANSPORT": transport}
    job = GlooJob("verdict_ddp_worker.py", ["kill"], 4, env=env, drop_env=["COMMRT_STALL_S"])
    for r in range(4):
        job.start(r)
    codes, outs = job.finish(2 * BOUND_S)  # DDP starts slowly on a loaded machine
    assert codes[2] == -signal.SIGKILL and all(c == 1 for c in codes[:2] + codes[3:]), outs
    began = float(re.search(r"stall from ([\d.]+)", outs[2]).group(1))
    assert time.time() - began <= VERDICT_WITHIN_S + 10, "the job outlived the death"
    return outs[:2] + outs[3:]


# each run its own test, so that runs spread over the suite's workers
@pytest.mark.parametrize(
    "transport, run_index", [*(("shm", i) for i in range(KILL_RUNS)), ("gloo", 0)]
)
@pytest.mark.slow
def test_a_killed_rank_under_ddp_is_the_only_rank_named_gone(transport, run_index):
    for out in killed_job(transport):
        flat = " ".join(out.split())
        named = {int(r) for pattern in NAMED_GONE for r in re.findall(pattern, flat)}
        assert named == {2}, f"run {run_index}: {named}\n{out}"
        assert told(out), f"run {run_index}\n{out}"
        wide = [line for line in out.splitlines() if len(line) > 80 and "commrt" in line]
        assert wide == [], f"run {run_index}: commrt's lines past 80 columns\n{out}"


@pytest.mark.parametrize(
    "case,n,thread",
    [("plain", 2, None), pytest.param("backup", 3, "commrt-backup-hb", marks=pytest.mark.slow)],
)
def test_a_program_that_never_closes_its_communicator_exits_cleanly(tmp_path, case, n, thread):
    """Ranks return from main with their communicator (and, with backup workers, their
    GradientSync) open. The threads that beat to the store are not daemons (a daemon thread
    that comes back from a store call while the interpreter shuts down aborts the process:
    "terminate called without an active exception", seen at the exit of ranks that never
    closed), and they end by themselves once the main thread is done, so the exit neither
    aborts nor waits for the communicator's timeout (60 s here)."""
    import json

    from helpers.mp import gloo_ranks

    began = time.monotonic()
    codes, outs = gloo_ranks(n, "open_exit_worker.py", str(tmp_path), case, timeout=50)
    assert codes == [0] * n, (codes, "\n".join(outs))
    assert time.monotonic() - began < 40, "an exit waited on something"
    for r in range(n):
        rep = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rep["sum"] == [float(n)] * 4, rep
        beating = ["commrt-stall-watch"] + ([f"{thread}-r{r}"] if thread else [])
        assert all(rep["threads"].get(name) is False for name in beating), rep["threads"]
    assert not any("terminate called" in out for out in outs), outs
