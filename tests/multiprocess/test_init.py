"""Launcher detection, init's argument checks (single process), and what ``auto`` picks
under torchrun (two real ranks)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.local_transport import run_ranks
from helpers.mp import TESTS

import commrt
import commrt.testing
import commrt.transports.stand_ins
from commrt.process.environment import LaunchInfo, detect_launch
from commrt.runtime.communicator import Communicator


def test_detect_mpich_hydra():
    info = detect_launch(
        {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    )
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_size) == (
        "mpiexec",
        2,
        4,
        0,
        2,
    )


def test_detect_open_mpi():
    info = detect_launch(
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        }
    )
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_size) == (
        "mpiexec",
        3,
        8,
        1,
        4,
    )


def test_detect_torchrun_wins_over_mpi():
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "PMI_RANK": "0",
        "PMI_SIZE": "1",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.master_addr, info.master_port) == (
        "torchrun",
        1,
        2,
        "10.0.0.1",
        29500,
    )


def test_detect_alone_and_bad_values():
    assert detect_launch({}).world_size == 1 and detect_launch({}).launcher == "none"
    with pytest.raises(ValueError, match="PMI_RANK='x' is not an integer"):
        detect_launch({"PMI_RANK": "x", "PMI_SIZE": "2"})


def test_init_alone_with_gloo_and_all_reduce_is_identity():
    with commrt.init("gloo") as comm:
        assert (comm.rank, comm.world_size, comm.backend, comm.device) == (
            0,
            1,
            commrt.Backend.GLOO,
            torch.device("cpu"),
        )
        t = torch.arange(5.0)
        assert commrt.all_reduce(t, comm, op="avg") is t and torch.equal(t, torch.arange(5.0))
        comm.barrier()
    with pytest.raises(commrt.CommError, match="closed"):
        comm.barrier()


def test_init_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown backend 'tcp'"):
        commrt.init("tcp")
    with pytest.raises(ValueError, match="timeout must be a positive"):
        commrt.init("gloo", timeout=0)
    with pytest.raises(ValueError, match="rank 3 is not in a world of 2"):
        commrt.init("gloo", rank=3, world_size=2)
    with pytest.raises(ValueError, match="MASTER_ADDR and MASTER_PORT"):
        commrt.init("gloo", rank=0, world_size=2)


@pytest.mark.parametrize(
    "timeout, error, says",
    [
        (1e10, ValueError, "at most 1e+08 (about 3 years), got 10000000000.0"),
        (float("inf"), ValueError, "at most 1e+08 (about 3 years), got inf"),
        (float("nan"), ValueError, "got nan"),
        (-1, ValueError, "got -1"),
        ("10", TypeError, "must be a number of seconds, got '10'"),
        (True, TypeError, "must be a number of seconds, got True"),
    ],
)
def test_init_takes_a_timeout_it_can_keep(timeout, error, says):
    """timeout=1e10 failed in torch's store ("client socket has timed out after
    10000000000000ms"), inf with OverflowError, nan with a ValueError about int conversion
    and "10" with a TypeError about '<=' (new-user trial): one line at the call instead."""
    with pytest.raises(error) as e:
        commrt.init("gloo", rank=0, world_size=2, timeout=timeout)
    assert str(e.value).startswith("timeout must be") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_the_longest_timeout_works_and_per_call_timeouts_are_checked_alike():
    with commrt.init("gloo", timeout=commrt.runtime.communicator.MAX_TIMEOUT_S) as comm:
        assert comm.timeout == 1e8
        comm.barrier(timeout=1e8)
        with pytest.raises(ValueError, match="timeout must be .* at most 1e\\+08"):
            comm.barrier(timeout=1e30)

    def body(tr):  # two ranks: one alone never waits, so never reads the timeout
        launch = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
        comm = Communicator(tr, commrt.Backend.GLOO, launch, 1e8, 1 << 20)
        t = torch.ones(2)
        commrt.all_reduce(t, comm, op="sum", timeout=1e8)
        with pytest.raises(ValueError, match="timeout must be .* at most 1e\\+08 .* got inf"):
            commrt.all_reduce(t, comm, timeout=float("inf"))
        return t.tolist()

    assert run_ranks(2, body) == [[2.0, 2.0]] * 2


def test_a_process_group_timeout_is_checked_alike():
    """dist.init_process_group("commrt", timeout=...) reaches commrt's groups too."""
    import datetime

    from commrt.distributed.devices import DeviceComms

    with pytest.raises(ValueError, match="the process group's timeout must be .* at most 1e\\+08"):
        DeviceComms(None, 0, 1, datetime.timedelta(days=10000), None, "g", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given when no GPU exists")
def test_nccl_without_gpu_says_so():
    with pytest.raises(
        RuntimeError, match="needs a CUDA GPU.*backend='shm'.*backend='mpi'.*'gloo'"
    ):
        with commrt.testing.engines(nccl=object()):
            commrt.init("nccl")


def test_all_reduce_input_errors():
    with commrt.init("gloo") as comm:
        with pytest.raises(ValueError, match="unsupported dtype torch.complex64"):
            commrt.all_reduce(torch.zeros(3, dtype=torch.complex64), comm)
        with pytest.raises(ValueError, match="op='avg' needs a floating-point"):
            commrt.all_reduce(torch.zeros(3, dtype=torch.int64), comm, op="avg")
        with pytest.raises(ValueError, match="unknown op 'median'"):
            commrt.all_reduce(torch.zeros(3), comm, op="median")
        with pytest.raises(TypeError, match="expected a torch.Tensor"):
            commrt.all_reduce([1.0], comm)
        with pytest.raises(ValueError, match="unknown algorithm"):
            commrt.all_reduce(torch.zeros(3), comm, algorithm="bogus")


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_under_torchrun_on_one_host_init_picks_shared_memory_as_the_torch_backend_does(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(_port()), os.path.join(TESTS, "workers", "choice_worker.py")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMRT_", "TORCH_DIST"))}
    env.update(OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [*cmd, str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in range(2):
        report = json.loads((tmp_path / f"{r}.json").read_text())
        assert report["init"] == "shm" and report["process_group"] == ["shm"], report
        assert report["init_sum"] == [0.0, 3.0, 6.0] and report["process_group_sum"] == [3.0] * 3


def test_init_holds_no_test_seam_and_a_stand_in_plugs_in_through_commrt_testing():
    """commrt.init's signature holds what users set; a test's engine plugs in through
    commrt.testing.engines, for the calls inside the block only."""
    import inspect

    from commrt.transports.stand_ins import stand_in

    params = set(inspect.signature(commrt.init).parameters)
    assert not params & {"nccl_module", "ipc_device"}, params
    sentinel = object()
    with commrt.testing.engines(nccl=sentinel):
        assert stand_in("nccl") is sentinel and stand_in("cuda_ipc") is None
        with commrt.testing.engines(cuda_ipc=sentinel):
            assert stand_in("nccl") is sentinel and stand_in("cuda_ipc") is sentinel
    assert stand_in("nccl") is None
    with pytest.raises(TypeError, match="no engine 'gloo' to replace"):
        with commrt.transports.stand_ins.plugged(gloo=sentinel):
            pass
