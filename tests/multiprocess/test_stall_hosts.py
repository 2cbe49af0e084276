"""The stall watch under mpiexec across hosts: rank 0 hosts its store on MASTER_ADDR, so
with MASTER_ADDR unset and ranks on different hosts every rank runs without a watch (and
rank 0 says so once) instead of failing to reach a loopback store on another machine."""

import pytest
from helpers.mp import mpiexec


@pytest.mark.mpi
def test_ranks_on_two_hosts_without_master_addr_run_without_a_watch_and_say_so():
    proc = mpiexec(2, "stall_hosts_worker.py", env={"MASTER_ADDR": ""}, timeout=200)
    out = proc.stdout + proc.stderr
    assert "watch 0 off" in out and "watch 1 off" in out, out
    assert out.count("no stall watch: the ranks span hosts and MASTER_ADDR is unset") == 1, out


@pytest.mark.mpi
def test_ranks_on_two_hosts_with_master_addr_keep_the_watch():
    proc = mpiexec(2, "stall_hosts_worker.py", env={"MASTER_ADDR": "127.0.0.1"}, timeout=200)
    out = proc.stdout + proc.stderr
    assert "watch 0 on" in out and "watch 1 on" in out, out
    assert "no stall watch" not in out, out
