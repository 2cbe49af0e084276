"""A rank that ends without closing its communicator (argv: output folder).

It makes a gloo communicator (whose stall watch beats to the job's store), runs one
all-reduce, writes what its threads are, and returns from main with the communicator
still open: the interpreter's exit must then neither hang nor abort."""

import json
import os
import sys
import threading

import torch

import commrt


def main(out: str) -> None:
    comm = commrt.init("gloo", timeout=60, abort_on_error=False)
    t = torch.ones(4)
    commrt.all_reduce(t, comm, op="sum")
    threads = {th.name: th.daemon for th in threading.enumerate()}
    report = {"sum": t.tolist(), "threads": threads}
    with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
