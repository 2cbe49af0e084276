"""Every torch.distributed call commrt implements, against the same call over gloo.

Launched torchrun-style. The default group is commrt's; a gloo group of the
same ranks computes the expected results (AVG, which gloo lacks, is SUM / p).
Also checks the public commrt.reduce_scatter / commrt.all_gather on a
communicator with ring, halving-doubling (power-of-two p) and torus2d.
Rank 0 writes {"cases": n, "failures": [...]} to argv[1].
"""

import json
import sys

import torch
import torch.distributed as dist

import commrt
from commrt.distributed import Options

R = dist.ReduceOp


def data(rank, n, dtype, k=0):
    g = torch.Generator().manual_seed(100 * rank + k)
    if dtype.is_floating_point:
        return torch.randint(-50, 50, (n,), generator=g).to(dtype) / 4
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


def small(rank, n, dtype, k=0):
    g = torch.Generator().manual_seed(100 * rank + k)
    return torch.randint(0, 2 if dtype == torch.bool else 16, (n,), generator=g).to(dtype)


def narrow_cases(rank, gloo):
    """SUM of the dtypes commrt.all_reduce does not take (gloo's and NCCL's sums wrap, and
    or bools) and the bitwise ops, through the executor's other reductions."""
    out = []
    for dtype, ops in (
        (torch.int8, (R.SUM, R.MAX, R.BXOR)),
        (torch.uint8, (R.SUM, R.MIN, R.BOR)),
        (torch.int16, (R.SUM, R.PRODUCT)),
        (torch.bool, (R.SUM, R.MAX, R.BAND, R.BOR)),
        (torch.int32, (R.BAND, R.BOR, R.BXOR)),
        (torch.int64, (R.BXOR,)),
    ):
        for op in ops:

            def run(group, op=op, dtype=dtype):
                t = small(rank, 333, dtype)
                if dtype == torch.int8:
                    t *= 40  # sums that wrap
                # gloo has no int16: its reference runs in int32, cut back (wraps alike)
                wide = t.int() if dtype == torch.int16 and group is not None else t
                dist.all_reduce(wide, op=op, group=group)
                return wide.to(dtype)

            out.append((f"all_reduce {op} {dtype}", lambda r=run: r(None), lambda r=run: r(gloo)))

    def rs_uint8(group):
        p = dist.get_world_size()
        o = torch.empty(5, dtype=torch.uint8)
        dist.reduce_scatter_tensor(o, small(rank, 5 * p, torch.uint8) * 30, group=group)
        return o

    out.append(("reduce_scatter_tensor sum uint8", lambda: rs_uint8(None), lambda: rs_uint8(gloo)))
    return out


def cases(rank, p, gloo):
    """(name, ours(), reference()) for each call: both return tensors to compare."""
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int64):
        for op in (R.SUM, R.MIN, R.MAX, R.PRODUCT, R.AVG):
            if op == R.AVG and not dtype.is_floating_point:
                continue
            if op == R.PRODUCT and dtype != torch.float64:
                continue  # products of 4 values stay exact in float64 only

            def ours(op=op, dtype=dtype):
                t = data(rank, 1001, dtype)
                dist.all_reduce(t, op=op)
                return t

            def ref(op=op, dtype=dtype):
                t = data(rank, 1001, dtype)
                dist.all_reduce(t, op=R.SUM if op == R.AVG else op, group=gloo)
                return t / p if op == R.AVG else t

            out.append((f"all_reduce {op} {dtype}", ours, ref))
    out += narrow_cases(rank, gloo)
    for op in (R.SUM, R.AVG, R.MAX):

        def rs(group, op=op):
            o = torch.empty(7)
            dist.reduce_scatter_tensor(o, data(rank, 7 * p, torch.float32), op=op, group=group)
            return o

        def rs_ref(op=op):
            o = rs(gloo, R.SUM if op == R.AVG else op)
            return o / p if op == R.AVG else o

        out.append((f"reduce_scatter_tensor {op}", lambda rs=rs: rs(None), rs_ref))

    def ag(group):
        o = torch.empty(5 * p, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(o, data(rank, 5, torch.bfloat16), group=group)
        return o

    def ag_list(group):
        outs = [torch.empty(3) for _ in range(p)]
        dist.all_gather(outs, data(rank, 3, torch.float32), group=group)
        return torch.cat(outs)

    def bcast(group):
        t = data(rank, 100, torch.float32)
        dist.broadcast(t, src=p - 1, group=group)
        return t

    def coalesced(group):
        ts = [data(rank, 10, torch.float32, k) for k in range(3)] + [data(rank, 4, torch.float32)]
        dist.all_reduce_coalesced(ts, group=group)
        return torch.cat([t.double() for t in ts])

    def rs_list(group):
        o = torch.empty(4)
        dist.reduce_scatter(o, [data(rank, 4, torch.float32, k) for k in range(p)], group=group)
        return o

    def gather(group):
        outs = [torch.empty(3) for _ in range(p)] if rank == 0 else None
        dist.gather(data(rank, 3, torch.float32), outs, dst=0, group=group)
        return torch.cat(outs) if rank == 0 else torch.zeros(1)

    def scatter(group):
        o = torch.empty(3)
        ins = [data(k, 3, torch.float32) for k in range(p)] if rank == 0 else None
        dist.scatter(o, ins, src=0, group=group)
        return o

    def a2a(group):
        o = torch.empty(2 * p)
        dist.all_to_all_single(o, data(rank, 2 * p, torch.float32), group=group)
        return o

    for name, fn in (
        ("all_gather_into_tensor", ag),
        ("all_gather", ag_list),
        ("broadcast", bcast),
        ("all_reduce_coalesced", coalesced),
        ("reduce_scatter", rs_list),
        ("gather", gather),
        ("scatter", scatter),
        ("all_to_all_single", a2a),
    ):
        out.append((name, lambda fn=fn: fn(None), lambda fn=fn: fn(gloo)))
    return out


def shard_cases(rank, p, comm):
    out = []
    algs = ["ring", "torus2d"] + (["halving_doubling"] if p & (p - 1) == 0 else [])
    for alg in algs:
        for op in ("sum", "avg"):
            inp = data(rank, 6 * p, torch.float32)
            full = sum(data(r, 6 * p, torch.float32) for r in range(p))
            want = full.chunk(p)[rank] / (p if op == "avg" else 1)
            got = commrt.reduce_scatter(torch.empty(6), inp, comm, algorithm=alg, op=op)
            out.append((f"commrt.reduce_scatter {alg} {op}", got, want))
        got = commrt.all_gather(torch.empty(4 * p), data(rank, 4, torch.float32), comm, alg)
        want = torch.cat([data(r, 4, torch.float32) for r in range(p)])
        out.append((f"commrt.all_gather {alg}", got, want))
    return out


def main(path):
    dist.init_process_group("commrt")
    rank, p = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    failures, n = [], 0
    for name, ours, ref in cases(rank, p, gloo):
        a, b = ours(), ref()
        n += 1
        tol = (2**-7 if a.dtype == torch.bfloat16 else 1e-6) * max(1.0, b.double().abs().max())
        if not torch.allclose(a.double(), b.double(), rtol=0, atol=tol):
            failures.append(f"rank {rank}: {name}: {a[:6].tolist()} != {b[:6].tolist()}")
    # a subgroup, and a group with its own algorithm (pg_options)
    sub = dist.new_group([0, 1], backend="commrt", pg_options=Options(algorithm="halving_doubling"))
    if rank < 2:
        t = torch.full((9,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        n += 1
        if (
            not torch.equal(t, torch.full((9,), 3.0))
            or sub.devices.algorithm.name != "halving_doubling"
        ):
            failures.append(f"rank {rank}: subgroup all_reduce gave {t.tolist()}")
    # send/recv with tags (two messages with different tags, received in reverse order)
    if p >= 2 and rank < 2:
        n += 1
        if rank == 0:
            dist.send(torch.full((3,), 1.0), 1, tag=7)
            dist.send(torch.full((3,), 2.0), 1, tag=8)
        else:
            a, b = torch.empty(3), torch.empty(3)
            wb = dist.irecv(b, 0, tag=8)
            wa = dist.irecv(a, 0, tag=7)
            wb.wait()
            wa.wait()
            if a[0] != 1.0 or b[0] != 2.0:
                failures.append(f"rank {rank}: send/recv with tags gave {a.tolist()} {b.tolist()}")
    dist.barrier()
    with commrt.init("gloo", timeout=60) as comm:
        for name, got, want in shard_cases(rank, p, comm):
            n += 1
            if not torch.allclose(got, want, rtol=1e-6):
                failures.append(f"rank {rank}: {name}: {got.tolist()} != {want.tolist()}")
    every = [None] * p
    dist.all_gather_object(every, failures, group=gloo)
    if rank == 0:
        with open(path, "w") as f:
            json.dump({"cases": n, "failures": [x for fs in every for x in fs]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
