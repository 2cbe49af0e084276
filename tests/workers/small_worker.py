"""The 8-byte all-reduce's steady state (the executor's memo of its last binding), then a
fault on the next call: each case must end in commrt's named error, not a hang.

    small_worker.py CASE

Both ranks first make ``WARM`` identical 8-byte all-reduces on one buffer (the calls the memo
serves). Cases:

* ``debug`` (``COMMRT_DEBUG=1``): rank 1 then calls with the same buffer seen as shape (1, 2)
  (same bytes, another call): every rank raises CollectiveMismatchError.
* ``closed``: rank 1 closes its communicator; rank 0's next call raises PeerClosedError.
* ``timeout``: rank 1 stays away (sleeps, then closes); rank 0's next call, with
  ``timeout=0.5``, raises CommTimeoutError.

Each rank prints ``rank R sum S`` after the warm calls, then ``rank R raised NAME: MESSAGE``
or ``rank R: no error``.
"""

import sys
import time

import torch

import commrt
from commrt.errors import CommError

WARM = 50


def main(case: str) -> int:
    comm = commrt.init("mpi", timeout=60)
    x = torch.ones(2)
    for _ in range(WARM):
        x.fill_(1.0)
        commrt.all_reduce(x, comm, algorithm="auto", op="sum")
    sys.stdout.write(f"rank {comm.rank} sum {x.sum().item():g}\n")
    sys.stdout.flush()
    try:
        if comm.rank == 1 and case == "debug":
            commrt.all_reduce(x.view(1, 2), comm, algorithm="auto", op="sum")
        elif comm.rank == 1 and case == "closed":
            comm.close()
            return 0
        elif comm.rank == 1 and case == "timeout":
            time.sleep(3.0)
            comm.close()
            return 0
        else:
            commrt.all_reduce(x, comm, algorithm="auto", op="sum", timeout=0.5)
    except CommError as e:
        sys.stdout.write(f"rank {comm.rank} raised {type(e).__name__}: {e}\n")
    else:
        sys.stdout.write(f"rank {comm.rank}: no error\n")
    sys.stdout.flush()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
