"""Run under torchrun (one host): what ``backend="auto"`` picks, through ``commrt.init()``
and through the torch.distributed backend, and that both sum right.

Each rank writes ``<out>/<rank>.json``: the transport each took and the sums' results.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import commrt


def main(out: str) -> None:
    report = {}
    with commrt.init() as comm:
        t = torch.arange(1000, dtype=torch.float32) * (comm.rank + 1)
        commrt.all_reduce(t, comm, op="sum")
        report["init"] = comm.backend.value
        report["init_sum"] = t[:3].tolist()
    dist.init_process_group("commrt")
    t = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    report["process_group"] = list(commrt.distributed.stats().transports)
    report["process_group_sum"] = t[:3].tolist()
    dist.destroy_process_group()
    with open(f"{out}/{os.environ['RANK']}.json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
