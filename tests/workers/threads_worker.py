"""A gloo rank that starts with more torch threads than its share of the node's cores, then
calls commrt.init; prints what it had, what it has, and the warnings init gave."""

import warnings

import torch

import commrt
from commrt.threads import usable_cores

had = usable_cores() + 1  # more than any share of the cores, on any machine
torch.set_num_threads(had)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    comm = commrt.init(backend="gloo")
x = torch.full((1 << 18,), float(comm.rank))  # 1 MiB: over torch's grain size (threads)
commrt.all_reduce(x, comm, op="sum")
assert (x == comm.world_size * (comm.world_size - 1) / 2).all()
msgs = [str(w.message) for w in caught if "torch threads" in str(w.message)]
print(f"rank {comm.rank} had {had} now {torch.get_num_threads()} warned {len(msgs)}: {msgs}")
comm.close()
