"""The "commrt" torch.distributed backend in real processes.

Ranks are launched torchrun-style (spawned with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and a store hosted by the test) or by mpiexec (CPU
traffic then goes over MPI). The oracle is the same program over gloo, run
in the same processes on a gloo group of the same ranks.
"""

import json
import re
import socket

import pytest
from helpers.mp import gloo_ranks, mpiexec


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ok(codes, outs):
    assert codes == [0] * len(codes), "\n---\n".join(o[-3000:] for o in outs)


def _check_ddp(report, n, algorithms, transport):
    assert report["world_size"] == n and report["backend"] == "commrt"
    assert report["group"] == "ProcessGroupCommrt" and report["cpu_transport"] == transport
    # plain DDP, find_unused_parameters=True, static_graph=True: parameters equal to gloo's
    want = {f"{a}/{m}" for a in algorithms for m in ("plain", "unused", "static")}
    assert set(report["errors"]) == want
    for case, err in report["errors"].items():
        assert err <= 1e-6, (case, err)
    assert report["ranks_agree"]


@pytest.mark.parametrize("transport", ["shm", "gloo"])
@pytest.mark.slow
def test_ddp_over_commrt_equals_ddp_over_gloo_torchrun_style(tmp_path, transport):
    """COMMRT_ALGORITHM=ring for the default group, then torus2d and auto for groups made
    with the variable set to them: one launch of 4 ranks. On one host the CPU transport is
    shared memory unless COMMRT_CPU_TRANSPORT asks for gloo."""
    out = tmp_path / "report.json"
    env = {"COMMRT_ALGORITHM": "ring"}
    if transport == "gloo":
        env["COMMRT_CPU_TRANSPORT"] = "gloo"
    codes, outs = gloo_ranks(4, "td_ddp_worker.py", out, "torus2d,auto", timeout=400, env=env)
    _ok(codes, outs)
    _check_ddp(json.loads(out.read_text()), 4, ["ring", "torus2d", "auto"], transport)


@pytest.mark.parametrize("one_core_each", [True, False])
@pytest.mark.slow  # DDP over commrt stays in the quick loop: the killed rank, Accelerate
def test_ddp_large_buckets_run_where_the_cores_say_and_equal_gloo(tmp_path, one_core_each):
    """The model's 155 kB weight is a bucket of its own, above the 64 KiB of a small call.
    Where each rank has one core (LOCAL_WORLD_SIZE above any machine's cores) it runs on
    the caller's thread inside backward; where the launcher does not say, on the call
    thread. Either way the parameters equal gloo's."""
    out = tmp_path / "report.json"
    env = {"COMMRT_ALGORITHM": "ring"}
    if one_core_each:
        env["LOCAL_WORLD_SIZE"] = "4096"
    drop = () if one_core_each else ("LOCAL_WORLD_SIZE",)
    codes, outs = gloo_ranks(2, "td_ddp_worker.py", out, timeout=300, env=env, drop_env=drop)
    _ok(codes, outs)
    report = json.loads(out.read_text())
    _check_ddp(report, 2, ["ring"], "shm")
    assert report["one_core_each"] is one_core_each
    if one_core_each:
        assert report["large_call_threads"] == ["MainThread"]
    else:
        assert report["large_call_threads"], "no large bucket ran"
        assert all(t.startswith("commrt-pg-") for t in report["large_call_threads"])


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["shm", "mpi"])
@pytest.mark.slow
def test_ddp_over_commrt_equals_ddp_over_gloo_under_mpiexec(tmp_path, transport):
    """On one host the world group goes through shared memory; COMMRT_CPU_TRANSPORT=mpi
    keeps MPI's path tested."""
    out = tmp_path / "report.json"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env["COMMRT_ALGORITHM"] = "torus2d"
    if transport == "mpi":
        env["COMMRT_CPU_TRANSPORT"] = "mpi"
    mpiexec(4, "td_ddp_worker.py", out, timeout=400, env=env)
    _check_ddp(json.loads(out.read_text()), 4, ["torus2d"], transport)


@pytest.mark.mpi
@pytest.mark.slow
def test_world_group_under_mpiexec_runs_over_mpi_in_torch_rank_order(tmp_path):
    """init_method= with explicit ranks (reversed against MPI's): still MPI, torch's order."""
    out = tmp_path / "report.json"
    mpiexec(3, "td_mpi_order_worker.py", out, timeout=200, env={"COMMRT_CPU_TRANSPORT": "mpi"})
    assert json.loads(out.read_text()) == {"cpu_transport": "mpi", "results_right": [True] * 3}


@pytest.mark.parametrize("nranks", [3, 4])
@pytest.mark.slow
def test_every_collective_equals_gloo(nranks, tmp_path):
    out = tmp_path / "report.json"
    _ok(*gloo_ranks(nranks, "td_collectives_worker.py", out, timeout=300))
    report = json.loads(out.read_text())
    assert report["failures"] == [], "\n".join(report["failures"][:10])
    assert report["cases"] >= 35


@pytest.mark.slow
def test_gossip_and_allreduce_hooks_inside_ddp(tmp_path):
    out = tmp_path / "report.json"
    _ok(*gloo_ranks(4, "td_hooks_worker.py", out, timeout=400))
    report = json.loads(out.read_text())
    assert report["failures"] == [], "\n".join(report["failures"][:10])
    # 5 iterations x 4 parameters x (½/½ check + GradientSync check) + the counter
    assert report["checks"] == 41 and report["buckets"] >= 2
    from commrt.algorithms import Gossip

    gossip = Gossip(topology="hypercube", rotate=True, seed=3)
    want = [[gossip.peers(r, t, 4)[1] for t in range(5)] for r in range(4)]
    assert report["peers"] == want
    assert report["disagreement"] > 0  # gossip let the models drift before the average


def test_fsdp2_over_commrt_equals_fsdp2_over_gloo(tmp_path):
    out = tmp_path / "report.json"
    _ok(*gloo_ranks(4, "td_fsdp_worker.py", out, timeout=400))
    report = json.loads(out.read_text())
    assert report["world_size"] == 4 and report["tensors"] == 6
    assert report["rel_err"] <= 1e-6, report


def test_unsupported_calls_are_named_on_every_rank_without_hanging(tmp_path):
    base = tmp_path / "seen"
    # COMMRT_DEBUG=1: every call is checked across ranks, as with commrt's own collectives
    env = {"COMMRT_DEBUG": "1"}
    _ok(*gloo_ranks(3, "td_errors_worker.py", base, "bad", timeout=200, env=env))
    for rank in range(3):
        seen = json.loads((tmp_path / f"seen.{rank}").read_text())
        assert seen["band"] == [
            "ValueError",
            "reduce op BAND needs an integer or bool tensor, got torch.float32",
        ]
        assert seen["premul"][0] == "NotImplementedError" and "PREMUL_SUM" in seen["premul"][1]
        assert seen["recv_anysource"][0] == "NotImplementedError"
        assert "recv_anysource" in seen["recv_anysource"][1] and "src=" in seen["recv_anysource"][1]
        assert "monitored_barrier" in seen["monitored_barrier"][1]
        assert seen["bool"] is None and seen["bool_sum"] == [True, False]  # or, as in gloo
        assert seen["gather_even"] is None
        kind, text = seen["gather_uneven"]
        bad = 1 if rank == 0 else 0  # the first output not of this rank's input size
        assert kind == "ValueError" and text.startswith(f"all_gather: output tensor {bad} is")
        assert seen["rs_list"] == [
            "ValueError",
            "reduce_scatter: input tensor 0 is torch.float32 of shape [3]; every input must "
            "match torch.float32 of 2 elements",
        ]
        # bad input leaves the group usable
        assert seen["still_works"] is None and seen["sum_after"] == 3.0
        kind, text = seen["mismatch"]
        assert kind == "CollectiveMismatchError"
        assert f"rank {rank} called all_reduce(shape=[{10 + rank}]" in text
        assert text.endswith("(COMMRT_DEBUG)")


#: a survivor's failed call naming the dead rank 2 ("peers [2]"): gloo's closed connection,
#: or shared memory's look at the peer's process
DIED = re.compile(r"a peer closed its connection: it probably died|rank 2's process .* is gone")
#: the stall verdict (in full, or the line that points to it) naming rank 2 dead
VERDICT_DEAD = re.compile(r"rank 2 \(host [^)]*\) is DEAD")


def test_a_rank_killed_mid_ddp_step_ends_the_job_naming_it(tmp_path):
    codes, outs = gloo_ranks(4, "td_errors_worker.py", tmp_path / "x", "kill", timeout=200)
    assert codes[2] == -9  # the rank that killed itself
    survivors = [r for r in range(4) if r != 2]
    for r in survivors:
        # ended through commrt's abort path: status 1, not a segfault (-11), not a hang (None)
        assert codes[r] == 1, (r, codes, outs[r][-2000:])
        assert f"rank {r} ran past the dead rank" not in outs[r]
        # its failed call names rank 2 (gloo's closed connection, or shared memory's look at
        # the peer's process), or the stall verdict that ended the job first names it dead
        flat = " ".join(outs[r].split())
        named = "peers [2]" in flat and DIED.search(flat)
        assert named or VERDICT_DEAD.search(flat), (r, outs[r][-2000:])
        assert not re.search(
            r"rank [013].s process .* is gone|rank [013] \(host [^)]*\) is DEAD", flat
        )


def test_readme_section_code_fits_80_columns():
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "README.md")) as f:
        text = f.read()
    title = "## From DDP, FSDP, torchrun, Lightning and Accelerate"
    assert title in text
    section = text.split(title, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\w*\n(.*?)```", section, re.S)
    assert len(blocks) >= 4
    wide = [line for b in blocks for line in b.splitlines() if len(line) > 80]
    assert wide == []
    assert 'DDPStrategy(process_group_backend=\n"commrt")' in section or "DDPStrategy" in section
