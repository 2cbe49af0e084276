"""All-reduce of CUDA tensors between ranks that share one GPU, beside gloo in the same run.

    python3 bench/bench_gpu_allreduce.py --ranks 2 4 --out out/gpu_allreduce.json

Each job of ``n`` ranks (spawned processes, every one on ``cuda:0``) times, per size,
in alternated rounds (the order flips every round; the median of the rounds is kept):

* ``dist.all_reduce`` on the default group, ``init_process_group("commrt")`` (CUDA
  tensors go over ``cuda_ipc``), against a ``new_group(backend="gloo")`` of the same ranks;
* ``commrt.all_reduce`` on a ``cuda_ipc`` communicator with each named algorithm
  (``auto``, ``ring``, ``one_shot``, ``two_shot``);
  (``one_shot`` sums on the host up to ``COMMRT_CUDA_IPC_HOST_BYTES``: set it to 0 for
  the device's sum, or larger to find where the two cross);
* the host path's parts, every rank at once: a copy to pinned host memory, a copy back,
  a copy back through a device buffer of over 64 KiB, and one small kernel;
* the round trips between rank 0 and rank 1: through a pipe (the host floor), and
  through IPC events (a stream's wait on a record in the other process).

Rank 0 writes one JSON document (ms per call, GB/s of the buffer's bytes) and prints a
table of at most 80 columns. Needs a CUDA GPU and CuPy; it is not a test and asserts
nothing (``docs/gpus.md`` keeps the figures it gives).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from functools import partial

import torch

#: buffer sizes in bytes (8 B is two fp32 values)
SIZES = [8, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
#: sizes of the host path's parts
PART_SIZES = [8, 4 << 10, 16 << 10, 64 << 10, (64 << 10) + 64, 256 << 10, 1 << 20]
#: the device buffer a padded copy back goes through (over 64 KiB)
PAD_BYTES = (64 << 10) + 64
#: algorithms timed directly on the cuda_ipc communicator
ALGORITHMS = ["auto", "ring", "one_shot", "two_shot"]


def calls_for(nbytes: int) -> int:
    """Calls per timed block: enough to last a few ms at the small sizes."""
    return max(2, min(100, (64 << 20) // max(nbytes, 1)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def timed(fns: dict, calls: int, rounds: int, barrier) -> dict:
    """Median seconds per call of each of ``fns`` over ``rounds`` alternated rounds."""
    got = {name: [] for name in fns}
    names = list(fns)
    for fn in fns.values():  # warm-up: plans, scratch, connections, compiles
        fn()
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            torch.cuda.synchronize()
            got[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(v) for name, v in got.items()}


def _dist_rows(n, rank, args, gloo, barrier) -> dict:
    """``dist.all_reduce`` on the default ("commrt") group against the gloo group."""
    import torch.distributed as dist

    rows = {}
    for size in args.sizes:
        x = torch.zeros(max(size // 4, 1), device="cuda")
        fns = {"commrt": partial(dist.all_reduce, x),
               "gloo": partial(dist.all_reduce, x, group=gloo)}  # fmt: skip
        rows[size] = timed(fns, calls_for(size), args.rounds, barrier)
        if rank == 0:
            print(f"dist {n} {size} {rows[size]}", flush=True)
    return rows


def _direct_rows(n, rank, args, comm, barrier) -> dict:
    """``commrt.all_reduce`` with each algorithm on the cuda_ipc communicator."""
    import commrt

    rows = {}
    for size in args.sizes:
        x = torch.zeros(max(size // 4, 1), device="cuda")
        fns = {a: partial(commrt.all_reduce, x, comm, algorithm=a, op="sum")
               for a in args.algorithms}  # fmt: skip
        rows[size] = timed(fns, calls_for(size), args.rounds, barrier)
        if rank == 0:
            print(f"direct {n} {size} {rows[size]}", flush=True)
    return rows


def _synced(fn):
    def run():
        fn()
        torch.cuda.current_stream().synchronize()

    return run


def _part_rows(n, rank, args, barrier) -> dict:
    """The host path's parts, every rank at once (each synchronised per call): a copy to
    pinned host memory; the two stream-to-stream waits a call's start and end enqueue; a
    copy back; the copy back through a device buffer of more than 64 KiB (a copy
    engine's, where small copies may ride the context's own channel); one small
    kernel."""
    rows = {}
    for size in PART_SIZES:
        x = torch.zeros(max(size // 4, 1), device="cuda")
        h = torch.zeros(x.numel(), pin_memory=True)
        big = max(x.numel(), (PAD_BYTES // 4))
        hpad, dpad = torch.zeros(big, pin_memory=True), torch.zeros(big, device="cuda")

        def padded(x=x, hpad=hpad, dpad=dpad):
            dpad.copy_(hpad, non_blocking=True)
            x.copy_(dpad[: x.numel()])

        side = torch.cuda.Stream()

        def events(side=side):  # what the transport's begin and end enqueue
            side.wait_stream(torch.cuda.current_stream())
            torch.cuda.current_stream().wait_stream(side)

        fns = {"to host": partial(h.copy_, x),
               "events": _synced(events),
               "to dev": _synced(partial(x.copy_, h, non_blocking=True)),
               "to dev pad": _synced(padded),
               "kernel": _synced(partial(x.add_, 0.0))}  # fmt: skip
        rows[size] = timed(fns, calls_for(size), args.rounds, barrier)
        if rank == 0:
            print(f"parts {n} {size} {rows[size]}", flush=True)
    return rows


def _event_round_trip(rank, pipe, calls: int = 300) -> float | None:
    """Microseconds per IPC-event round trip between ranks 0 and 1 (rank 0's figure):
    A records, B's stream waits on it and records, A's stream waits on that, A's host
    waits; the pipe orders each record before the wait (a stream waits only for records
    issued before it)."""
    from commrt.transports.cuda_ipc_device import CudaDevice

    dev = CudaDevice(torch.device("cuda", 0))
    stream, mine = dev.new_stream(), dev.create_event()
    pipe.send_bytes(dev.export_event(mine))
    theirs = dev.open_event(pipe.recv_bytes())
    done = dev.create_event()
    t0 = time.perf_counter()
    for _ in range(calls):
        if rank == 0:
            dev.record(mine, stream)
            pipe.send_bytes(b"r")
            pipe.recv_bytes()
            dev.wait_event(stream, theirs)
            dev.record(done, stream)
            while not dev.query(done):
                pass
        else:
            pipe.recv_bytes()
            dev.wait_event(stream, theirs)
            dev.record(mine, stream)
            pipe.send_bytes(b"r")
    stream.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6 if rank == 0 else None


def _pipe_round_trip(rank, pipe, calls: int = 2000) -> float | None:
    """Microseconds per message there and back between ranks 0 and 1 (rank 0's)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        if rank == 0:
            pipe.send_bytes(b"x")
            pipe.recv_bytes()
        else:
            pipe.recv_bytes()
            pipe.send_bytes(b"x")
    return (time.perf_counter() - t0) / calls * 1e6 if rank == 0 else None


def rank_main(rank: int, n: int, ports: list, args, pipe, q) -> None:
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(ports[0]))  # fmt: skip
        torch.cuda.set_device(0)
        import torch.distributed as dist

        import commrt

        report: dict = {"ranks": n}
        dist.init_process_group("commrt", rank=rank, world_size=n)
        gloo = dist.new_group(backend="gloo")
        barrier = partial(dist.barrier, group=gloo)
        if "dist" in args.sections:
            report["dist.all_reduce"] = _dist_rows(n, rank, args, gloo, barrier)
        comm = commrt.init("cuda_ipc", master_port=ports[1], timeout=120, stall_s=0)
        report["commrt.all_reduce"] = _direct_rows(n, rank, args, comm, barrier)
        if "parts" in args.sections:
            report["parts"] = _part_rows(n, rank, args, barrier)
        if rank == 0:  # what is known, should the round trips fail or hang
            q.put(("partial", dict(report)))
        if "trips" in args.sections and rank < 2:
            report["pipe round trip us"] = _pipe_round_trip(rank, pipe)
            report["IPC event round trip us"] = _event_round_trip(rank, pipe)
        barrier()
        comm.close()
        dist.destroy_process_group()
        if rank == 0:
            q.put(("final", report))
    except BaseException as e:  # reported by the parent
        import traceback

        q.put(("error", f"rank {rank}: {e!r}\n{traceback.format_exc()}"))


def run_job(n: int, args) -> dict:
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    a, b = ctx.Pipe()
    ports = [free_port() for _ in range(3)]
    procs = []
    for r in range(n):
        end = a if r == 0 else b if r == 1 else None
        procs.append(ctx.Process(target=rank_main, args=(r, n, ports, args, end, q)))
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout
    got, errors = None, []
    try:
        while True:
            kind, what = q.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "error":  # the others may wait on it forever: what is known stands
                errors.append(what)
                break
            else:
                got = what
            if kind == "final":
                break
    except queue.Empty:
        errors.append(f"no final report from rank 0 within {args.timeout:.0f} s")
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 20)
            if p.is_alive():
                p.kill()
    for e in errors:
        print(f"{n} ranks: {e}", file=sys.stderr)
    if got is None:
        raise RuntimeError("; ".join(e.splitlines()[0] for e in errors))
    return got


def fmt_size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def table(report: dict) -> list[str]:
    n = report["ranks"]
    lines = [f"{n} ranks on one GPU: ms per call (median of alternated rounds)"]
    head = f"{'size':>8} {'commrt':>8} {'gloo':>8} {'x gloo':>7} {'GB/s':>7}"
    dist_rows = report.get("dist.all_reduce", {})
    lines += ["dist.all_reduce, 'commrt' against 'gloo'", head] if dist_rows else []
    for size, row in dist_rows.items():
        c, g = row["commrt"], row["gloo"]
        lines.append(f"{fmt_size(int(size)):>8} {c * 1e3:8.3f} {g * 1e3:8.3f} "
                     f"{c / g:7.2f} {int(size) / c / 1e9:7.1f}")  # fmt: skip
    algos = list(next(iter(report["commrt.all_reduce"].values())))
    lines += ["commrt.all_reduce over cuda_ipc, ms per call",
              f"{'size':>8} " + " ".join(f"{a:>9}" for a in algos)]  # fmt: skip
    for size, row in report["commrt.all_reduce"].items():
        lines.append(f"{fmt_size(int(size)):>8} " + " ".join(f"{row[a] * 1e3:9.3f}" for a in algos))
    parts = report.get("parts", {})
    names = list(next(iter(parts.values()), {}))
    if names:
        lines += ["host path's parts, every rank at once, ms per call",
                  f"{'size':>8} " + " ".join(f"{a[-9:]:>9}" for a in names)]  # fmt: skip
    for size, row in parts.items():
        lines.append(f"{fmt_size(int(size)):>8} " + " ".join(f"{row[a] * 1e3:9.3f}" for a in names))
    for what in ("pipe round trip us", "IPC event round trip us"):
        if report.get(what) is not None:
            lines.append(f"{what[:-3]}, rank 0 to 1 and back: {report[what]:.1f} µs")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="bytes")
    ap.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--sections",
        nargs="+",
        default=["dist", "parts", "trips"],
        help="beside commrt.all_reduce: dist, parts, trips (default: all)",
    )
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per job")
    ap.add_argument("--out", default=None, help="JSON file of every job's figures")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time", file=sys.stderr)
        return 2
    reports, status = [], 0
    for n in args.ranks:
        try:
            report = run_job(n, args)
        except RuntimeError as e:
            print(f"{n} ranks: FAILED: {e}", file=sys.stderr)
            status = 1
            continue
        reports.append(report)
        print("\n".join(table(report)), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(reports, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
