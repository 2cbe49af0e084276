"""Run under mpiexec: Torus2D vs ring, MPI Allreduce, torch.distributed (gloo) and float64.

argv: report path, grid shapes ("2x2,1x4"; "2x2s3" is the pipelined torus, see grid()). One launch covers the mpi and
gloo transports, the given grids plus ``algorithm="torus2d"`` (default
shape) and the ring, sizes divisible and not divisible by p, sum and avg,
float32, bfloat16 and integer-valued float64 (where every result must be
bit-identical: small integer sums are exact whatever the order). Rank 0
writes a JSON report.
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
from commrt.algorithms import PipelinedTorus2D, Torus2D  # noqa: E402

SIZES = [1, 7, 1000, 1_000_003]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64-int": torch.float64}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grid(spec):
    """ "2x3" -> Torus2D(2, 3); "2x2s3" -> PipelinedTorus2D(2, 2, segments=3) (direct
    columns); "2x2s3r" -> the same with ring columns."""
    shape, _, seg = spec.partition("s")
    rows, cols = map(int, shape.split("x"))
    if not seg:
        return Torus2D(rows, cols)
    return PipelinedTorus2D(rows, cols, int(seg.rstrip("r")), not seg.endswith("r"))


def main(out_path, shapes):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    port = world.bcast(free_port() if rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p)
    comms = {"mpi": commrt.init("mpi", timeout=60), "gloo": commrt.init("gloo", timeout=60)}
    algorithms = {f"Torus2D({s})": grid(s) for s in shapes.split(",")}
    algorithms["torus2d"] = "torus2d"
    algorithms["ring"] = "ring"

    # a shape that does not fit p fails on every rank before any message, and the next call still works
    bad = []
    for comm in comms.values():
        try:
            commrt.all_reduce(torch.ones(10), comm, algorithm=Torus2D(p - 1, p - 1))
            bad.append(False)
        except ValueError as e:
            bad.append("take part" in str(e))
    bad_ok = all(bad)

    cases, failures = 0, []
    for n in SIZES:
        g = torch.Generator().manual_seed(1234 + 7 * rank + n)
        for dname, dt in DTYPES.items():
            exact = dname == "float64-int"
            x = (
                torch.randint(-100, 100, (n,), generator=g).to(dt)
                if exact
                else torch.randn(n, generator=g, dtype=torch.float64).to(dt)
            )
            xd = x.double()
            ref = xd.clone()
            world.Allreduce(MPI.IN_PLACE, ref.numpy(), op=MPI.SUM)  # float64 reference
            mag = xd.abs()
            world.Allreduce(MPI.IN_PLACE, mag.numpy(), op=MPI.SUM)
            mpi_in = x.clone() if dt != torch.bfloat16 else x.float()  # MPI has no bf16
            world.Allreduce(MPI.IN_PLACE, mpi_in.numpy(), op=MPI.SUM)
            td = x.clone()
            dist.all_reduce(td)
            # |out - ref| <= rtol * sum_r |x_r|: fp32 1e-6, bf16 p * 2^-8 (as in allreduce_worker.py)
            rtol = {"float32": 1e-6, "bfloat16": p * 2.0**-8, "float64-int": 0.0}[dname]
            # an average scales each input by 1/p before the sum (commrt's one rule for AVG):
            # exact where 1/p is (p a power of two); else each scaled input rounds once
            exact_avg = p & (p - 1) == 0
            avg_rtol = rtol if not exact or exact_avg else p * 2.0**-52
            for tname, comm in comms.items():
                for op in ("sum", "avg"):
                    outs = {}
                    for aname, alg in reversed(list(algorithms.items())):  # ring first
                        t = x.clone()
                        commrt.all_reduce(t, comm, algorithm=alg, op=op)
                        outs[aname] = t
                    ring = outs["ring"].double()
                    for aname, t in outs.items():
                        got = t.double() * (p if op == "avg" else 1)
                        bound = (avg_rtol if op == "avg" else rtol) * mag
                        if dt == torch.bfloat16 and op == "avg":
                            bound = bound + 2.0**-8 * got.abs()
                        oracles = (
                            ("float64", ref, 1),
                            ("mpi_allreduce", mpi_in, 2),
                            ("torch_dist", td, 2),
                            ("ring", ring * (p if op == "avg" else 1), 2),
                        )
                        errs = {
                            k: ((got - o.double()).abs() - w * bound).max().item()
                            for k, o, w in oracles
                        }
                        if (
                            exact and exact_avg and op == "avg"
                        ):  # same exact scale, same sum: bit-identical to the ring
                            errs["ring_avg_bits"] = 0.0 if torch.equal(t.double(), ring) else 1.0
                        cases += 1
                        if any(v > 0 for v in errs.values()):
                            failures.append(
                                dict(
                                    rank=rank,
                                    transport=tname,
                                    algorithm=aname,
                                    op=op,
                                    n=n,
                                    dtype=dname,
                                    excess=errs,
                                )
                            )
    default_shape = Torus2D().shape(p, comms["mpi"].local_size)
    gathered = world.gather((cases, failures, bad_ok), root=0)
    for c in comms.values():
        c.close()
    dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(
                {
                    "world_size": p,
                    "cases": sum(c for c, _, _ in gathered),
                    "failures": [x for _, fs, _ in gathered for x in fs],
                    "bad_shape_errors": [b for _, _, b in gathered],
                    "default_shape": list(default_shape),
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
