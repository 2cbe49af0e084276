"""Run under mpiexec: gossip on real ranks. Rank 0 writes a JSON report to argv[2].

argv[1] = "full": GradientSync mixing (sync, async, dissemination) over mpi and
gloo, messages counted at the transport, exact averaging through the
executor, the shuffle, average_parameters against MPI Allreduce, bad input.
argv[1] = "count": only the message count and exact averaging (mpi), cheap
enough for p = 8 on a small machine.
"""

import hashlib
import json
import os
import sys
import time

import torch
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.gossip import gossip_model, gossip_steps, gossip_targets, run_shuffle, shard  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import Gossip  # noqa: E402
from commrt.transports.counting import CountingTransport  # noqa: E402

STEPS = 4


def count_messages(comm, alg):
    """Per step: (messages this rank sent, the peers they went to) under GradientSync."""
    inner = comm.transport
    comm.transport = counter = CountingTransport(inner)
    try:
        m = gossip_model()
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        rows = []
        with commrt.GradientSync(
            m, comm, algorithm=alg, bucket_mb=0.02, first_bucket_mb=0.005
        ) as sync:
            nb = len(sync.buckets)
            for s in range(STEPS):
                counter.reset()
                sum(
                    (q * t).sum() for q, t in zip(m.parameters(), gossip_targets(m, comm.rank, s))
                ).backward()
                sync.step(opt)
                sync.quiesce()  # async: the exchange of this step runs after wait(); count it here
                rows.append(
                    {
                        "messages": counter.messages,
                        "bytes": counter.bytes,
                        "peers": sorted(counter.by_peer),
                        "scheduled": alg.peers(comm.rank, s, comm.world_size)[0]
                        if isinstance(alg, Gossip) and comm.world_size > 1
                        else None,
                    }
                )
        return {
            "buckets": nb,
            "steps": rows,
            "bucket_bytes": sum(4 * b.numel for b in sync.buckets),
        }
    finally:
        comm.transport = inner


def exact_average(comm, world):
    """Pure gossip of one float64 vector through the executor: exact mean after log2 p steps."""
    p, out = comm.world_size, []
    g = Gossip("hypercube", seed=9)
    L = g.period_length(p)
    for period in range(3):
        x = torch.randn(
            1001,
            dtype=torch.float64,
            generator=torch.Generator().manual_seed(comm.rank + 10 * period),
        )
        want = x.clone()
        world.Allreduce(MPI.IN_PLACE, want.numpy(), op=MPI.SUM)
        want /= p
        for t in range(period * L, (period + 1) * L):
            x.mul_(0.5)
            with comm.lock:
                comm.executor.run(g.schedule(p, step=t), x, comm.transport, timeout=comm.timeout)
        out.append(float((x - want).abs().max()))
    return out


def main(mode, path):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    comms = {"mpi": commrt.init("mpi", timeout=60)}
    if mode == "full":
        comms["gloo"] = commrt.init("gloo", timeout=60)
    report = {"world_size": p, "count": {}, "exact": exact_average(comms["mpi"], world)}
    report["count"]["gossip"] = count_messages(comms["mpi"], Gossip())
    report["count"]["gossip-async"] = count_messages(comms["mpi"], Gossip(asynchronous=True))
    report["count"]["ring"] = count_messages(comms["mpi"], commrt.algorithms.Ring())
    if mode == "full":
        report["mix"] = {}
        for name, comm in comms.items():
            for alg in (Gossip(), Gossip(asynchronous=True), Gossip("dissemination", seed=3)):
                steps, nb, _ = gossip_steps(comm, alg)
                report["mix"][f"{name} {alg}"] = {"steps": steps, "buckets": nb}
            start, x, y, batches = run_shuffle(comm)
            _, x2, y2, batches2 = run_shuffle(comm, overlap=False)
            x0, y0 = shard(rank)
            table = lambda a, b: torch.cat([a, b.double()[:, None]], 1)  # noqa: E731
            mine_before = [r.numpy().tobytes().hex() for r in table(x0, y0)]
            mine_after = [r.numpy().tobytes().hex() for r in table(x, y)]
            report[f"shuffle {name}"] = {
                "before": world.gather(mine_before, root=0),
                "after": world.gather(mine_after, root=0),
                "changed": set(y.tolist()) != start,
                "size": len(y),
                "forced_same": bool(
                    torch.equal(x, x2) and torch.equal(y, y2) and batches == batches2
                ),
            }
        # average_parameters against MPI's own float64 Allreduce
        m = gossip_model()
        with torch.no_grad():
            for i, q in enumerate(m.parameters()):
                q.add_(
                    torch.randn(q.shape, generator=torch.Generator().manual_seed(rank * 100 + i))
                    * 0.01
                )
        flat = torch.cat([q.detach().flatten().double() for q in m.parameters()])
        ref = flat.clone()
        world.Allreduce(MPI.IN_PLACE, ref.numpy(), op=MPI.SUM)
        ref /= p
        d = commrt.average_parameters(m, comms["gloo"])
        after = torch.cat([q.detach().flatten() for q in m.parameters()])
        mine = ((flat - ref).norm() / ref.norm()).item()
        report["average"] = {
            "equal_to_mpi": bool(torch.equal(after, ref.float())),
            "d": d,
            "d_ref": world.allreduce(mine, op=MPI.MAX),
            "same_on_all": world.allreduce(d, op=MPI.MAX) == world.allreduce(d, op=MPI.MIN),
        }
        # bad input on one rank only: every rank raises, at once
        t0 = time.monotonic()
        try:
            commrt.data.GossipShuffle(
                shard(rank), comms["mpi"], fraction=-0.1 if rank == 1 else 0.5
            )
            msg = None
        except ValueError as e:
            msg = str(e)
        report["bad_fraction"] = world.gather(
            {"message": msg, "seconds": time.monotonic() - t0}, root=0
        )
    for c in comms.values():
        c.close()
    if rank == 0:
        if mode == "full":
            for name in comms:
                sh = report[f"shuffle {name}"]
                sh["hash_before"] = hashlib.sha256(
                    "".join(sorted(sum(sh.pop("before"), []))).encode()
                ).hexdigest()
                sh["hash_after"] = hashlib.sha256(
                    "".join(sorted(sum(sh.pop("after"), []))).encode()
                ).hexdigest()
        with open(path, "w") as f:
            json.dump(report, f)
    # every rank's own findings: rank 0's file holds only rank 0's view of the per-rank checks
    if mode == "full":
        rows = world.gather(
            {k: v for k, v in report.items() if k.startswith(("mix", "shuffle"))}, root=0
        )
        if rank == 0:
            with open(path + ".ranks", "w") as f:
                json.dump(rows, f)
    counts = world.gather(report["count"], root=0)
    if rank == 0:
        with open(path + ".counts", "w") as f:
            json.dump(counts, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
