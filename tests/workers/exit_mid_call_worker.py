"""Rank 0 ends its program while one of commrt's threads is inside a call into gloo
(argv: which thread: ``call``, ``p2p``, ``progress`` or ``gossip``).

Rank 0 starts the call on the thread and leaves main with ``sys.exit(3)``; its
interpreter then takes a while to finish (an object whose ``__del__`` sleeps, as a
program's teardown may). Rank 1 joins the call only after ``JOIN_S``, so the thread comes
back from gloo while rank 0 is shutting down. A daemon thread that comes back from C++
then aborts the process; a thread that follows commrt's rule (non-daemon, its loop ends
when the program does) lets it end with its own code, 3.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import commrt

#: seconds rank 1 waits before it joins the call rank 0's thread is in
JOIN_S = 1.5
#: seconds rank 0's teardown takes: longer than JOIN_S, so the call ends inside it
TEARDOWN_S = 3.0


class SlowTeardown:
    """Held by a module global: its ``__del__`` runs while the interpreter finalizes."""

    def __del__(self, sleep=time.sleep):
        sleep(TEARDOWN_S)


def start_call(case: str, rank: int):
    """Start the case's call (on rank 1: JOIN_S after the group is made)."""
    if case in ("call", "p2p"):
        dist.init_process_group("commrt")
        t = torch.ones(4)
        if rank == 1:
            time.sleep(JOIN_S)
        if case == "call":
            work = dist.all_reduce(t, async_op=True)
        elif rank == 0:
            work = dist.irecv(t, src=1)
            work.get_future()  # the helper thread waits for it
        else:
            work = dist.isend(t, dst=0)
        return work
    from commrt.algorithms import Gossip

    comm = commrt.init("gloo", timeout=60, abort_on_error=False)
    model = torch.nn.Linear(4, 2)
    alg = Gossip(deadline_s=0.2) if case == "gossip" else "ring"
    sync = commrt.GradientSync(model, comm, algorithm=alg)
    if rank == 1:
        time.sleep(JOIN_S)
    model(torch.ones(3, 4)).sum().backward()  # the progress thread starts the bucket
    if case == "gossip" and rank == 0:  # the step ends at the deadline; the waiter waits on
        sync.step(torch.optim.SGD(model.parameters(), lr=0.1))
    return sync


def main(case: str) -> None:
    os.environ.setdefault("COMMRT_ABORT_ON_ERROR", "0")
    os.environ.setdefault("COMMRT_CPU_TRANSPORT", "gloo")  # its waits are in C++
    rank = int(os.environ["RANK"])
    held = start_call(case, rank)
    if rank == 1:
        if case in ("call", "p2p"):
            held.wait()
        else:
            held.step(torch.optim.SGD(held.model.parameters(), lr=0.1))
        print("rank 1 done", flush=True)
        return
    globals()["teardown"] = SlowTeardown()
    globals()["held"] = held  # kept to the end, as a program's objects are
    print("rank 0 leaves main", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
