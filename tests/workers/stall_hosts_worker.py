"""A 2-rank MPI job whose rank 1 says it runs on another host: with MASTER_ADDR unset, no
rank starts a stall watch (rank 0's loopback store would be out of rank 1's reach); with
it set, every rank does. Prints ``watch <rank> <on|off>``; an all-reduce proves the job
still runs."""

import os
import socket
import sys

if os.environ.get("PMI_RANK") == "1":
    socket.gethostname = lambda: "another-host"  # the only difference between the ranks

import torch  # noqa: E402

import commrt  # noqa: E402

comm = commrt.init("mpi", stall_s=30)
t = torch.ones(4)
commrt.all_reduce(t, comm, op="sum")
assert t.tolist() == [2.0] * 4, t
print(f"watch {comm.rank} {'on' if comm.stall is not None else 'off'}", flush=True)
comm.close()
sys.exit(0)
