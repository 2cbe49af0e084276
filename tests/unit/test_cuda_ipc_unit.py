"""The ``cuda_ipc`` transport's checks that need no second process: refused without CUDA
(by name), ranks on another host named, the slot size's variable and the host sum's
bound checked, ranks that disagree on that bound refused."""

import os

import pytest
import torch
from helpers.ipc_standin import StandInDevice

import commrt
from commrt.transports.cuda_ipc_connect import (
    boot_id,
    host_bytes_from_env,
    reach_problem,
    slot_bytes_from_env,
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_init_on_a_cpu_machine_is_refused_naming_cuda():
    with pytest.raises(RuntimeError, match=r"backend 'cuda_ipc' needs CUDA.*no CUDA GPU"):
        commrt.init(backend="cuda_ipc", rank=0, world_size=1)


def _me(dev, boot=None, pid=None):
    from commrt.transports.processes import start_time

    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": start_time(pid), "boot": boot or boot_id(),
            "identity": dev.identity(), "why": ""}  # fmt: skip


def test_a_rank_on_another_host_is_named():
    dev = StandInDevice()
    me = _me(dev)
    try:
        assert reach_problem(0, me, [me, dict(me)], dev) == ""
        elsewhere = dict(me, boot="another-boot")
        assert "rank 1 is on another host" in reach_problem(0, me, [me, elsewhere], dev)
        gone = dict(me, start=-1)  # a pid this host sees with another start time
        assert "rank 1 is on another host" in reach_problem(0, me, [me, gone], dev)
    finally:
        dev.close()


def test_devices_without_peer_access_are_named():
    a, b = StandInDevice(name="gpu0", peer_access=False), StandInDevice(name="gpu1")
    try:
        why = reach_problem(0, _me(a), [_me(a), _me(b)], a)
        assert "has no peer access to rank 1's" in why and "gpu1" in why, why
    finally:
        a.close()
        b.close()


def test_the_slot_size_variable_is_checked():
    assert slot_bytes_from_env({}) == 4 << 20
    assert slot_bytes_from_env({"COMMRT_CUDA_IPC_SLOT_BYTES": "4096"}) == 4096
    for bad in ("0", "17", "lots"):
        with pytest.raises(ValueError, match="COMMRT_CUDA_IPC_SLOT_BYTES"):
            slot_bytes_from_env({"COMMRT_CUDA_IPC_SLOT_BYTES": bad})


def test_the_host_sum_bound_is_checked():
    assert host_bytes_from_env({}) == 1 << 20
    assert host_bytes_from_env({"COMMRT_CUDA_IPC_HOST_BYTES": "0"}) == 0
    for bad in ("-1", "lots"):
        with pytest.raises(ValueError, match="COMMRT_CUDA_IPC_HOST_BYTES"):
            host_bytes_from_env({"COMMRT_CUDA_IPC_HOST_BYTES": bad})


def test_ranks_that_bound_the_host_sum_differently_are_refused_alike():
    """A rank that sums a call on the host would wait forever for one that sums it on the
    device: connect refuses, on every rank, naming the variable and each rank's value."""
    import threading

    import torch.distributed as dist

    from commrt.transports.cuda_ipc_connect import connect

    store, got = dist.HashStore(), {}
    devs = [StandInDevice(seed=r) for r in range(2)]

    def rank(r):
        got[r] = connect(store, r, 2, devs[r], 10.0, 4096, host_bytes=(1 << 20) * (r + 1))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert got[0] == got[1], got
        assert "COMMRT_CUDA_IPC_HOST_BYTES differs" in got[0], got
        assert "rank 0: 1048576, rank 1: 2097152" in got[0], got
    finally:
        for dev in devs:
            dev.close()
