"""Run under mpiexec -n 3: the MPI NCCL stand-in (tests/helpers/nccl_standin.py) keeps
NCCL's rules. argv: out_dir. Each rank writes <out_dir>/rank<r>.json.

* ``subset``: ranks 0 and 1 create a communicator of all three; rank 2 never does.
* ``pair``: ranks 0 and 2 make a communicator of their own (rank 1 takes no part),
  while the world's communicator carries other messages between the same ranks.
* ``async``: a receive returns at once; its data lands later, on the stream.
"""

import json
import os
import sys
import time

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.nccl_standin import StandInNccl  # noqa: E402
from helpers.nccl_strict import StandInHang  # noqa: E402

from commrt.transports.nccl import NcclTransport  # noqa: E402

CPU = torch.device("cpu")


def transport(nccl, members, uid_from, world):
    """An NcclTransport of the world ranks ``members`` (this rank among them), its id made
    by world rank ``uid_from`` and passed around over MPI."""
    uid = world.bcast(nccl.get_unique_id() if world.Get_rank() == uid_from else None, uid_from)
    me = world.Get_rank()
    if me not in members:
        return None
    return NcclTransport(members.index(me), len(members), uid, CPU, nccl=nccl, timeout=30)


def subset(nccl, world) -> str:
    if world.Get_rank() == 2:
        world.bcast(None, 0)
        return "stayed out"
    try:
        transport(nccl, [0, 1, 2], 0, world)
    except StandInHang as e:
        return str(e)
    return "made"


def pair(nccl, world) -> list:
    whole = transport(nccl, [0, 1, 2], 0, world)
    two = transport(nccl, [0, 2], 2, world)
    me = world.Get_rank()
    if me == 1:
        return []
    peer_whole, peer_two = 2 - me, 1 - two.rank
    a, b = torch.full((3,), float(me)), torch.full((5,), float(10 + me))
    got_a, got_b = torch.zeros(3), torch.zeros(5)
    end = time.monotonic() + 30
    if me == 0:  # the world's message first, the pair's second
        first = whole.exchange([(a, peer_whole)], [(got_a, peer_whole)], 0)
        second = two.exchange([(b, peer_two)], [(got_b, peer_two)], 0)
    else:  # the other way round
        second = two.exchange([(b, peer_two)], [(got_b, peer_two)], 0)
        first = whole.exchange([(a, peer_whole)], [(got_a, peer_whole)], 0)
    for pend in (first, second):
        assert pend.wait_recv(0, end) and pend.wait_send(0, end)
    return [got_a.tolist(), got_b.tolist()]


def asynchronous(nccl, world) -> list:
    t = transport(nccl, [0, 1, 2], 0, world)
    me = world.Get_rank()
    if me == 2:
        world.Barrier()
        return []
    got, seen = torch.zeros(4), []
    if me == 0:
        pend = t.exchange([], [(got, 1)], 0)  # returns before rank 1 has even sent
        seen.append(got.tolist())
        world.Barrier()
        assert pend.wait_recv(0, time.monotonic() + 30)
        seen.append(got.tolist())
    else:
        world.Barrier()
        pend = t.exchange([(torch.full((4,), 7.0), 0)], [], 0)
        assert pend.wait_send(0, time.monotonic() + 30)
    return seen


def main(out_dir):
    world = MPI.COMM_WORLD
    report = {
        "subset": subset(StandInNccl(hang_s=2.0), world),
        "pair": pair(StandInNccl(), world),
        "async": asynchronous(StandInNccl(), world),
    }
    with open(os.path.join(out_dir, f"rank{world.Get_rank()}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
