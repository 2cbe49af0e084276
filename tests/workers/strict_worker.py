"""Every family over the strict NCCL stand-in (tests/helpers/nccl_strict.py), as gloo_ranks ranks.

    strict_worker.py SCENARIO OUTDIR

Each rank writes OUTDIR/<scenario>_rank<r>.json.

* ``families``: ring, halving-doubling and Torus2D all-reduce (sum and avg,
  float32/float64, irregular sizes) against a float64 reference every rank
  computes from every rank's seeded data; gossip (hypercube, synchronous
  and asynchronous; dissemination) through GradientSync against the exact
  mix (tests/unit/test_gossip.py's oracle); a barrier and the native all-reduce.
* ``mismatch``: rank 0 sends 4 float32 where rank 1 receives 8: a named
  error on both, no hang.
* ``catchup``: backup workers' catch-up alone, between a server and a
  late rank that never exchanged before; ``slowserve``: the server starts
  its send 1 s after answering (the two connected before); ``serverdies``:
  the server answers, then is recorded dead and killed while the late rank
  waits for its snapshot (in ``groupEnd``, the two never connected);
  ``diesinwait``: the same, connected before (in the receive's wait).
* ``stuck``: rank 1 never comes to rank 0's first exchange: rank 0's
  groupEnd blocks on the new connection until the watchdog aborts it; then
  ``with commrt.init(...)`` must exit (no destroy() hang).
* ``slowserve-stream``, ``diesinwait-stream``: ``slowserve`` and
  ``diesinwait`` on a stand-in whose groups complete as on a CUDA stream
  (``device_streams``): a receive's wait returns at once and only the late
  rank's host wait sees the snapshot land. No all-reduce runs there (its
  host reductions would not wait for the data): the server connects to the
  late rank with one plain message.
"""

import atexit
import datetime
import json
import os
import signal
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.engines import init_with  # noqa: E402
from helpers.gossip import gossip_model, gossip_steps, gossip_targets  # noqa: E402
from helpers.nccl_strict import StrictNccl  # noqa: E402

import commrt  # noqa: E402
from commrt.algorithms import BackupWorkers, Gossip, Ring, Torus2D  # noqa: E402

SIZES = (1, 7, 1000, 40_003)


def strict_comm(timeout=60.0, hang_s=30.0, **modes):
    return init_with(
        "nccl",
        StrictNccl(hang_s=hang_s, **modes),
        device="cpu",
        timeout=timeout,
        abort_on_error=False,
    )


def data(rank, n, dtype):
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + n)).to(dtype)


def all_reduces(comm):
    p, failures, cases = comm.world_size, [], 0
    algorithms = {"ring": "ring", "halving_doubling": "halving_doubling"}
    if p == 4:
        algorithms["torus 2x2"] = Torus2D(2, 2)
    for name, alg in algorithms.items():
        for n in SIZES:
            for dtype in (torch.float32, torch.float64):
                for op in ("sum", "avg"):
                    t = data(comm.rank, n, dtype)
                    commrt.all_reduce(t, comm, algorithm=alg, op=op)
                    want = sum(data(r, n, dtype).double() for r in range(p))
                    want = want / p if op == "avg" else want
                    err = float((t.double() - want).abs().max())
                    tol = 1e-12 if dtype == torch.float64 else 1e-5 * p
                    cases += 1
                    if err > tol:
                        failures.append([name, n, str(dtype), op, err])
    native = torch.full((5,), float(comm.rank + 1))
    comm.transport.native_all_reduce(native, "sum")
    if not torch.equal(native, torch.full((5,), float(p * (p + 1) // 2))):
        failures.append(["native", native.tolist()])
    comm.barrier()
    return cases, failures


def gossip(comm):
    out = {}
    algs = [Gossip(), Gossip(asynchronous=True), Gossip("dissemination", asynchronous=True)]
    for alg in algs:
        steps, nb, _ = gossip_steps(comm, alg)
        out[str(alg)] = {"steps": steps, "buckets": nb}
    return out


def gradient_sync(comm, alg, steps=3):
    """GradientSync with an all-reduce ``alg``: per step, are the gradients exactly the
    average of every rank's (integer-valued, so exact in any order)?"""
    m = gossip_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    p, out = comm.world_size, []
    with commrt.GradientSync(m, comm, algorithm=alg, bucket_mb=0.02, first_bucket_mb=0.005) as sync:
        for s in range(steps):
            sum(
                (q * t).sum() for q, t in zip(m.parameters(), gossip_targets(m, comm.rank, s))
            ).backward()
            sync.step(opt, zero_grad=False)
            per_rank = [gossip_targets(m, r, s) for r in range(p)]
            want = [sum(ts) / p for ts in zip(*per_rank)]
            out.append(all(torch.equal(q.grad, w) for q, w in zip(m.parameters(), want)))
            opt.zero_grad(set_to_none=True)  # dropped while nothing may still read them
    return out


def families(comm):
    cases, failures = all_reduces(comm)
    syncs = {"ring": gradient_sync(comm, "ring")}
    if comm.world_size == 4:
        syncs["torus 2x2"] = gradient_sync(comm, Torus2D(2, 2))
    return {"cases": cases, "failures": failures, "gossip": gossip(comm), "sync": syncs}


def mismatch(comm):
    peer = 1 - comm.rank
    t = torch.ones(4 if comm.rank == 0 else 8)
    start = time.monotonic()
    try:
        if comm.rank == 0:
            ex = comm.transport.exchange([(t, peer)], [], 0)
            ok = ex.wait_send(0, time.monotonic() + comm.timeout)
        else:
            ex = comm.transport.exchange([], [(t, peer)], 0)
            ok = ex.wait_recv(0, time.monotonic() + comm.timeout)
        return {"error": None, "ok": ok}
    except commrt.CommError as e:
        return {
            "error": f"{type(e).__name__}: {e}",
            "broken": comm.transport.broken,
            "elapsed": time.monotonic() - start,
        }


def catchup(comm, server=0, connected=False, serve_late_s=0.0, dies=False):
    """Backup workers' catch-up alone: ranks 0 and 1 are on time (and have exchanged with each
    other only, as a ring over them does), the last rank is late and asks for a snapshot; no
    collective ever connected a server to it before, unless ``connected`` (a ring over every
    rank first: rank 1 then has sent to the late rank). The ``server`` starts its send
    ``serve_late_s`` after answering; one that ``dies`` answers, waits for the late rank's
    receive, is recorded dead (as liveness would) and kills itself."""
    from commrt.runtime.store import ControlStore
    from commrt.sync.backup import CatchUp, Keys

    torch.manual_seed(comm.rank)
    model = torch.nn.Linear(30, 20)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = list(model.parameters())
    store = ControlStore.open(comm).client(Keys.space(0))
    cu = CatchUp(comm, store, params, BackupWorkers(1))
    late = comm.world_size - 1
    rec, start = {}, time.monotonic()
    stream = not comm.transport.host_waits  # completes as a device stream: no host reductions
    try:
        if stream:
            if connected and comm.rank in (server, late):
                _connect(comm, server, late)
        elif connected or comm.rank != late:
            ring = torch.ones(8)
            with comm.lock:  # the ring the inner all-reduce runs (the on-time ranks only)
                members = range(comm.world_size if connected else late)
                sched = Ring().schedule(comm.world_size, tuple(members))
                comm.executor.run(sched, ring, comm.transport, timeout=comm.timeout)
        if comm.rank == late:
            resp = cu.receive(cu.request(0), 0, opt)
            rec["got_step"] = resp["step"]
        else:
            model(torch.ones(2, 30)).sum().backward()
            opt.step()  # global step 1, with momentum state
            if comm.rank == server:
                _serve(cu, store, opt, comm.timeout, serve_late_s, dies)
        rec["error"] = None
    except commrt.CommError as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["elapsed"] = time.monotonic() - start
    rec["served"] = cu.server.served
    rec["broken"] = getattr(comm.transport, "broken", None)
    rec["params"] = [p.detach().flatten().tolist() for p in params]
    rec["momentum"] = [
        opt.state[p].get("momentum_buffer", torch.zeros(0)).flatten().tolist() for p in params
    ]
    return rec


def _connect(comm, server, late) -> None:
    """One message from ``server`` to ``late``: the connection a ring over every rank makes."""
    from commrt.schedule.p2p import Exchange, Where

    buf = torch.ones(8)
    peer = late if comm.rank == server else server
    moves = [(buf, peer)]
    sends, recvs = (moves, []) if comm.rank == server else ([], moves)
    Exchange(comm, sends, recvs, 0, Where("connect")).complete()


def _serve(cu, store, opt, timeout, serve_late_s, dies) -> None:
    """Answer request 0 as a stream-ordered server does (the send starts once the late rank
    marked its receive posted), ``serve_late_s`` late; or die once the receive is posted."""
    from commrt.sync.backup import Keys

    server = cu.server  # the catch-up's on-time side
    deadline = time.monotonic() + 2 * timeout
    while time.monotonic() < deadline and server.served == 0:
        server.serve(opt, 1, None, send_now=False)  # claims the request and answers it
        time.sleep(0.005)
    if dies:
        while not store.check([Keys.posted(0)]) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.3)  # the late rank is inside its receive's wait
        store.set(Keys.dead(server.rank), "0")  # what liveness writes
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(serve_late_s)  # busy elsewhere (its compute) before it looks again
    while time.monotonic() < deadline and server.busy:
        server.serve(opt, 1, None, send_now=False)
        time.sleep(0.005)


def _mark_then_send(comm, store, mark_first: bool) -> dict:
    """The catch-up handshake alone, between two ranks that never exchanged: rank 1 receives
    and marks (before or after its groupEnd), rank 0 sends once it sees the mark."""
    buf = torch.arange(1000.0) if comm.rank == 0 else torch.zeros(1000)
    start, rec = time.monotonic(), {}
    try:
        if comm.rank == 1:
            if mark_first:
                store.set("posted", "1")
            pend = comm.transport.exchange([], [(buf, 0)], 0)
            if not mark_first:
                store.set("posted", "1")
            assert pend.wait_recv(0, time.monotonic() + comm.timeout)
            rec["received"] = torch.equal(buf, torch.arange(1000.0))
        else:
            deadline = time.monotonic() + comm.timeout + 2
            while not store.check(["posted"]) and time.monotonic() < deadline:
                time.sleep(0.01)
            rec["saw_mark"] = store.check(["posted"])
            if rec["saw_mark"]:
                pend = comm.transport.exchange([(buf, 1)], [], 0)
                assert pend.wait_send(0, time.monotonic() + comm.timeout)
        rec["error"] = None
    except commrt.CommError as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["elapsed"] = time.monotonic() - start
    return rec


def handshake(out):
    """The old order (mark after groupEnd) deadlocks on the strict stand-in; mark first works."""
    from commrt.runtime.store import ControlStore

    rec = {}
    for name, mark_first in (("after", False), ("first", True)):
        comm = strict_comm(timeout=3.0)
        store = ControlStore.open(comm).client(f"handshake/{name}")
        rec[name] = _mark_then_send(comm, store, mark_first)
        store.set(f"done{comm.rank}", "1")  # both ranks finish this phase before the next init
        store.wait([f"done{1 - comm.rank}"], datetime.timedelta(seconds=60))
        comm.close()
        rec["rank"] = comm.rank
    with open(os.path.join(out, f"handshake_rank{rec['rank']}.json"), "w") as f:
        json.dump(rec, f)


def main(scenario, out):
    if scenario == "handshake":
        return handshake(out)
    if scenario == "stuck":
        return stuck(out)
    timeouts = {"catchup": 5.0, "slowserve": 5.0, "serverdies": 20.0, "diesinwait": 20.0}
    base, _, mode = scenario.partition("-")
    modes = {"device_streams": True} if mode == "stream" else {}
    comm = strict_comm(timeout=timeouts.get(base, 60.0), **modes)
    rec = {"rank": comm.rank, "world_size": comm.world_size}
    run = {
        "families": families,
        "mismatch": mismatch,
        "catchup": catchup,
        "slowserve": lambda c: catchup(c, 1, connected=True, serve_late_s=1.0),
        "serverdies": lambda c: catchup(c, 1, dies=True),
        "diesinwait": lambda c: catchup(c, 1, connected=True, dies=True),
    }[base]
    rec.update(run(comm))
    closing = time.monotonic()
    comm.close()
    rec["close_s"] = time.monotonic() - closing
    with open(os.path.join(out, f"{scenario}_rank{comm.rank}.json"), "w") as f:
        json.dump(rec, f)


def stuck(out):
    """Rank 0's first exchange with rank 1, which never comes (it sleeps, then leaves)."""
    timeout = 3.0
    with strict_comm(timeout=timeout, hang_s=120.0) as comm:
        rec = {"rank": comm.rank}
        if comm.rank == 1:
            time.sleep(timeout + 8)
            return
        start = time.monotonic()
        try:
            commrt.all_reduce(torch.ones(10), comm, algorithm="ring")
            rec["error"] = None
        except commrt.CommError as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        rec["raised_after"] = time.monotonic() - start
        rec["broken"] = comm.transport.broken
        rec["closing_at"] = time.time()  # then close(): it must not wait on the stuck group

        def write():
            rec["exited_at"] = time.time()
            with open(os.path.join(out, "stuck_rank0.json"), "w") as f:
                json.dump(rec, f)

        atexit.register(write)


if __name__ == "__main__":
    main(*sys.argv[1:])
