"""Run under mpiexec: commrt.all_reduce vs MPI Allreduce, torch.distributed and float64.

One launch checks the mpi transport, the gloo and shm transports (rendezvous
over MPI) and the NCCL adapter with the MPI stand-in, for every algorithm, size,
dtype and op. Rank 0 writes a JSON report to argv[1].
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.engines import init_with
from helpers.nccl_standin import StandInNccl  # noqa: E402

import commrt  # noqa: E402

SIZES = [1, 7, 1000, 1_000_003]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
# |out - ref| <= RTOL[dtype] * sum_r |x_r|, elementwise: rounding error is
# relative to the magnitude of the terms, not of their (possibly tiny) sum.
# fp32: 1e-6 (p <= 4 adds at unit roundoff 6e-8); bf16: p * 2^-8 (one rounding
# per hop at unit roundoff 2^-8, the sum travels in bf16 between hops).
RTOL = {"float32": 1e-6, "float64": 1e-12}
ALGORITHMS = (
    sys.argv[2].split(",")
    if len(sys.argv) > 2
    else ["ring", "halving_doubling", "recursive_doubling"]
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(out_path):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    port = world.bcast(free_port() if rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p)
    port2 = world.bcast(free_port() if rank == 0 else None)
    standin = StandInNccl()
    comms = {
        "mpi": commrt.init("mpi", timeout=60),
        "gloo": commrt.init("gloo", timeout=60),
        "shm": commrt.init("shm", timeout=60),
        "nccl-standin": init_with("nccl", standin, device="cpu", timeout=60),
        # second NCCL rendezvous path: the unique id through a TCPStore
        "nccl-standin-store": init_with(
            "nccl",
            StandInNccl(),
            device="cpu",
            timeout=60,
            master_addr="127.0.0.1",
            master_port=port2,
        ),
    }
    results, failures = [], []
    for n in SIZES:
        g = torch.Generator().manual_seed(1234 + 7 * rank + n)
        x64 = torch.randn(n, generator=g, dtype=torch.float64)
        for dname, dt in DTYPES.items():
            x = x64.to(dt)
            xd = x.double()
            ref = xd.clone()
            world.Allreduce(MPI.IN_PLACE, ref.numpy(), op=MPI.SUM)  # float64 reference
            mag = xd.abs()
            world.Allreduce(MPI.IN_PLACE, mag.numpy(), op=MPI.SUM)
            rtol = RTOL.get(dname, p * 2.0**-8)
            # oracle 1: MPI Allreduce in the same dtype (fp32 copy for bf16: MPI has no bf16)
            mpi_in = x.clone() if dt != torch.bfloat16 else x.float()
            world.Allreduce(MPI.IN_PLACE, mpi_in.numpy(), op=MPI.SUM)
            # oracle 2: torch.distributed.all_reduce (gloo) in the same dtype
            td = x.clone()
            dist.all_reduce(td)
            for tname, comm in comms.items():
                for alg in ALGORITHMS:
                    for op in ("sum", "avg"):
                        t = x.clone()
                        commrt.all_reduce(t, comm, algorithm=alg, op=op)
                        got = t.double() * (p if op == "avg" else 1)
                        bound = rtol * mag + (
                            2.0**-8 * got.abs() * (op == "avg") if dt == torch.bfloat16 else 0
                        )
                        # an oracle in the same dtype rounds too: allow both errors against it
                        errs = {
                            k: ((got - o.double()).abs() - w * bound).max().item() if n else -1.0
                            for k, o, w in (
                                ("float64", ref, 1),
                                ("mpi_allreduce", mpi_in, 2),
                                ("torch_dist", td, 2),
                            )
                        }
                        case = dict(
                            rank=rank,
                            transport=tname,
                            algorithm=alg,
                            op=op,
                            n=n,
                            dtype=dname,
                            excess=errs,
                        )
                        results.append(case)
                        if any(v > 0 for v in errs.values()):
                            failures.append(case)
    # also: the NCCL adapter passed the right dtype codes and counts
    codes = sorted({c[2] for c in standin.calls})
    if codes != [7, 8, 9]:
        failures.append({"rank": rank, "nccl_dtype_codes": codes})
    all_results = world.gather((len(results), failures), root=0)
    for c in comms.values():
        c.close()
    dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(
                {
                    "world_size": p,
                    "cases": sum(n for n, _ in all_results),
                    "failures": [f for _, fs in all_results for f in fs],
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main(sys.argv[1])
