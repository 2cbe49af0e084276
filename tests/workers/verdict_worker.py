"""A 4-rank job that stalls one way (argv[1]), for the stall verdict's tests.

Cases (rank 3 is the culprit unless said): ``user`` sleeps in
``load_next_batch``; ``stop`` stops itself (SIGSTOP); ``kill`` kills itself
(SIGKILL); ``other``: rank 2 calls broadcast while the others all-reduce;
``barrier``: like ``user``, the others in a barrier;
``chain``: rank 3 in user code while the others run a ring in reverse order
(rank r receives from r+1: 2 waits on 3, 1 on 2, 0 on 1); ``slow``: 20
iterations with random compute delays shorter than the stall watch, no
stall; ``timeout``: like ``user`` under ``commrt.init(timeout=20)`` and the
default watch (the verdict forms at the timeout); ``caught``: the same, the
others catch the error, print it and leave with ``os._exit``; ``size``:
after 5 agreed all-reduces of 1000 elements rank 1 all-reduces 999.
Backend argv[2] (gloo, mpi, shm; cuda_ipc on a GPU). Every rank that gets past the stall
prints "finished" (none should, but ``slow``).
"""

import os
import random
import signal
import sys
import time

import torch

import commrt
from commrt.algorithms import Ring


def load_next_batch(seconds: float) -> None:
    stall_from()
    time.sleep(seconds)  # a data loader that hangs


def stall_from() -> None:
    """Say when the stall begins: the test bounds the time to the verdict from here."""
    print(f"stall from {time.time():.3f}", flush=True)


#: the timeout of the cases that stall without a shorter watch (VERDICT_TIMEOUT_S: the
#: test's own, shorter where a test runs the case many times)
TIMEOUT_S = float(os.environ.get("VERDICT_TIMEOUT_S", "20"))


def main(case: str, backend: str) -> None:
    comm = commrt.init(backend, timeout=TIMEOUT_S if case in ("timeout", "caught") else 120)
    rank, culprit = comm.rank, comm.world_size - 1
    t = torch.ones(8, device=comm.device)  # (cuda_ipc: CUDA tensors)
    if case == "size":
        sizes(comm)
    for _ in range(2):  # every call signature agreed before the stall
        commrt.all_reduce(t, comm, algorithm="ring")
        commrt.broadcast(t, comm, root=0)
    if case in ("timeout", "caught"):
        at_the_timeout(comm, t, case == "caught")
    if case == "slow":
        stall_s = float(os.environ["COMMRT_STALL_S"])
        rng = random.Random(rank)
        for _ in range(20):
            time.sleep(rng.uniform(0, stall_s / 2))
            commrt.all_reduce(t, comm, algorithm="ring")
    elif case in ("user", "barrier") and rank == culprit:
        load_next_batch(300)
    elif case == "barrier":
        comm.barrier()
    elif case == "stop" and rank == culprit:
        stall_from()
        os.kill(os.getpid(), signal.SIGSTOP)
    elif case == "kill" and rank == culprit:
        stall_from()
        os.kill(os.getpid(), signal.SIGKILL)
    elif case == "other" and rank == 2:
        stall_from()
        commrt.broadcast(t, comm, root=0)
    elif case == "chain":
        if rank == culprit:
            load_next_batch(300)
        reverse = Ring().schedule(comm.world_size, ranks=tuple(reversed(range(comm.world_size))))
        comm.run_schedule(reverse, t)
    else:
        commrt.all_reduce(t, comm, algorithm="ring")
    print(f"rank {rank}: finished", flush=True)
    comm.close()


def sizes(comm) -> None:
    """Five agreed all-reduces of 1000 elements, then rank 1 reduces 999."""
    for _ in range(5):
        commrt.all_reduce(torch.ones(1000), comm, algorithm="ring")
    if comm.rank == 1:
        stall_from()
    commrt.all_reduce(torch.ones(999 if comm.rank == 1 else 1000), comm, algorithm="ring")


def at_the_timeout(comm, t, caught: bool) -> None:
    """Rank 3 in its data loader, the others in an all-reduce until the timeout."""
    if comm.rank == comm.world_size - 1:
        load_next_batch(300)
    try:
        commrt.all_reduce(t, comm, algorithm="ring")
    except commrt.CommError as e:
        if not caught:
            raise
        print(f"rank {comm.rank} caught: {e}", flush=True)  # a script that logs and quits
        os._exit(3)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "gloo")
