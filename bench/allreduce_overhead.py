"""commrt's own per-call cost of a small all-reduce, without a network (issue 25's profile).

Rank 0 of 2 runs over a transport whose messages complete at once (a receive gets what
the same position's send holds, as if the peer were this rank's mirror), so what is timed
is commrt's Python: the tensor check, the settled-call memo or the full path (resolve, call
check, auto's select and observe), the lock, the executor. The minimum over many short
repeats is kept: on a loaded machine a repeat without preemption is the one that measures
the code. Compare two installs by running it with each interpreter in turn::

    python bench/allreduce_overhead.py [--number 1000] [--repeat 100]
"""

from __future__ import annotations

import argparse
import timeit

import torch

import commrt
from commrt.algorithms import Auto
from commrt.comm import Backend, Communicator, LaunchInfo
from commrt.sim import Network
from commrt.transports.base import Pending, Prepared, Transport, poll_until


def _done() -> bool:
    return True


class _Done(Pending):
    __slots__ = ("spin_s", "check")

    def __init__(self):
        self.spin_s, self.check = 0.0, None

    def wait_recv(self, i, deadline):
        return poll_until(_done, deadline, self.spin_s, self.check)

    def wait_send(self, i, deadline):
        return poll_until(_done, deadline, self.spin_s, self.check)


class _Prepared(Prepared):
    """As MPI's persistent requests: a start hands back the same pending operations."""

    __slots__ = ("pending",)

    def __init__(self, *args):
        super().__init__(*args)
        self.pending = _Done()

    def start(self, spin_s=0.0):
        self.pending.spin_s, self.pending.check = spin_s, self.transport.waiting_check()
        return self.pending


class Mirror(Transport):
    """Rank 0 of 2; every message completes at once."""

    name = "mirror"

    def __init__(self):
        super().__init__(0, 2, torch.device("cpu"))

    def exchange(self, sends, recvs, tag):
        for (s, _), (r, _) in zip(sends, recvs):
            r.copy_(s)
        return _Done()

    def prepare(self, sends, recvs, tag):
        return _Prepared(self, sends, recvs, tag)

    def barrier(self, timeout):
        return True

    def native_all_reduce(self, tensor, op="sum"):
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=1000, help="calls per repeat")
    p.add_argument("--repeat", type=int, default=100, help="repeats; the fastest is kept")
    args = p.parse_args()
    comm = Communicator(Mirror(), Backend.MPI, LaunchInfo("none", 0, 2, 0, 2), 60.0, 4 << 20)
    x, y = torch.zeros(2), torch.zeros(4)
    # a fixed network: no probe; the model is off, so auto learns first (warm-up below)
    auto = Auto(network=Network.flat(alpha_s=2e-6, beta_s_per_byte=1e-9))
    for _ in range(200):
        for t in (x, y):
            commrt.all_reduce(t, comm, algorithm=auto, op="sum")
            commrt.all_reduce(t, comm, algorithm="rd", op="sum")
    sched = commrt.algorithms.resolve("rd").select(2, 8, comm)
    env = dict(commrt=commrt, comm=comm, x=x, y=y, auto=auto, sched=sched)
    cases = {
        "auto, 8 B, same call": ("commrt.all_reduce(x, comm, algorithm=auto, op='sum')", 1),
        "rd, 8 B, same call": ("commrt.all_reduce(x, comm, algorithm='rd', op='sum')", 1),
        "auto, 8 B and 16 B in turn": (
            "commrt.all_reduce(x, comm, algorithm=auto, op='sum'); "
            "commrt.all_reduce(y, comm, algorithm=auto, op='sum')",
            2,
        ),
        "comm.run_schedule alone": ("comm.run_schedule(sched, x, owner=x)", 1),
    }
    print(f"{'per call, min of ' + str(args.repeat) + ' repeats':<34} ns")
    for name, (stmt, calls) in cases.items():
        best = min(timeit.repeat(stmt, globals=env, number=args.number, repeat=args.repeat))
        print(f"{name:<34} {best / args.number / calls * 1e9:6.0f}")
    comm.close()


if __name__ == "__main__":
    main()
