"""Run under mpiexec: commrt.broadcast against MPI Bcast and torch.distributed.broadcast.

Every rank fills its tensor with its own values (so a rank that kept its
data, or got a wrong piece, shows); after the broadcast all three results
must equal the root's tensor bit for bit. Rank 0 writes a JSON report.
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import commrt  # noqa: E402
from commrt.algorithms import BinomialTree, PipelinedChain  # noqa: E402

SIZES = (1, 7, 1_000_003)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data(rank, n):
    return torch.randn(n, generator=torch.Generator().manual_seed(97 * rank + n))


def main(out):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    port = world.bcast(free_port() if rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p)
    comms = {"mpi": commrt.init("mpi", timeout=60), "gloo": commrt.init("gloo", timeout=60)}
    failures, cases = [], 0
    for name, comm in comms.items():
        for n in SIZES:
            for root in (0, p - 1):
                want = data(root, n)
                ref_mpi = data(rank, n)
                world.Bcast(ref_mpi.numpy(), root=root)
                ref_td = data(rank, n)
                dist.broadcast(ref_td, src=root)
                for alg in (None, BinomialTree(), PipelinedChain(chunks=5)):
                    got = data(rank, n)
                    commrt.broadcast(got, comm, root=root, algorithm=alg)
                    cases += 1
                    ok = (
                        torch.equal(got, want)
                        and torch.equal(got, ref_mpi)
                        and torch.equal(got, ref_td)
                    )
                    if not ok:
                        failures.append(
                            {
                                "rank": rank,
                                "transport": name,
                                "n": n,
                                "root": root,
                                "algorithm": repr(alg),
                                "max_err": (got - want).abs().max().item(),
                            }
                        )
    cases = world.reduce(cases, root=0)
    failures = world.gather(failures, root=0)
    for c in comms.values():
        c.close()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"cases": cases, "failures": [x for fs in failures for x in fs]}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
