"""A gloo rank that starts with more torch threads than its share of the node's cores, then
makes a communicator (``commrt.init``, or ``init_process_group("commrt")`` with the argument
``dist``); prints what it had, what it has, and the warnings it got."""

import sys
import warnings

import torch
import torch.distributed as dist

import commrt
from commrt.process.threads import usable_cores

DIST = sys.argv[1:] == ["dist"]
had = usable_cores() + 1  # more than any share of the cores, on any machine
torch.set_num_threads(had)
x = torch.full((1 << 18,), 1.0)  # 1 MiB: over torch's grain size (threads)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if DIST:
        dist.init_process_group("commrt")
        dist.all_reduce(x)
        rank, size = dist.get_rank(), dist.get_world_size()
    else:
        comm = commrt.init(backend="gloo")
        commrt.all_reduce(x, comm, op="sum")
        rank, size = comm.rank, comm.world_size
assert (x == size).all()
msgs = [str(w.message) for w in caught if "torch threads" in str(w.message)]
print(f"rank {rank} had {had} now {torch.get_num_threads()} warned {len(msgs)}: {msgs}")
if DIST:
    dist.destroy_process_group()
else:
    comm.close()
