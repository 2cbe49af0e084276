"""Chaos trials for backup workers: 4 gloo ranks, b = 1, a 16 MB model, one rank SIGKILLed
(or, with ``--signal stop``, SIGSTOPped) at a random moment of a random step; the 3
survivors must finish every global step with bit-identical parameters and optimizer state::

    python tools/chaos_backup.py --trials 20          # about 30 s a trial here
    python tools/chaos_backup.py --signal stop --timeout 4

A stopped rank keeps its connections open, so nothing reports it: only its silent
heartbeat does. The trial kills it once the survivors have ended.

Each trial picks, from its seed, the victim, the global step and a moment inside that step
(every fifth trial: a moment inside ``close()``). Just before it kills itself, the victim looks at what its threads
are doing (their Python stacks) and records the phase: ``compute``, ``all-reduce`` (the
progress thread inside a reduction or its redo), ``catch-up`` (a snapshot being served or
received) or ``close``. A trial passes when the victim died by SIGKILL, the survivors exited
0 without an error, hold the same global step (the last one), the same parameter and
optimizer-state hash, and each applied exactly as many updates (its own, plus those a
catch-up jumped over) as the global steps. Prints one row a trial and the phase counts;
exits 1 if any trial failed. Results: out/chaos/trials.json.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

from commrt import settings

RANKS, BACKUPS, STEPS = 4, 1, 24
HERE = os.path.abspath(__file__)


# ----------------------------------------------------------------------------- a rank
#: where the victim's main loop is: "train", "close" (inside sync.close()) or "closed"
WHERE = {"now": "train"}


def _phase() -> str:
    """What this process is doing, from every thread's Python stack."""
    if WHERE["now"] == "closed":
        return "after close"
    files = []
    for f in sys._current_frames().values():
        while f is not None:
            files.append((os.path.basename(f.f_code.co_filename), f.f_code.co_name))
            f = f.f_back
    names = {n for _, n in files}
    if any(fn == "catchup.py" for fn, _ in files):
        return "catch-up"
    if WHERE["now"] == "close" or "close" in names:
        return "close"
    if any(fn in ("executor.py", "recovery.py", "wire.py") for fn, _ in files):
        return "all-reduce"
    return "compute"


def _kill_later(delay_s: float, out: str, signum: int = signal.SIGKILL) -> None:
    def fire():
        time.sleep(delay_s)
        with open(os.path.join(out, "phase.txt"), "w") as f:
            f.write(_phase())
        if os.environ.get("CHAOS_STACKS"):
            import traceback

            with open(os.path.join(out, "stacks.txt"), "w") as f:
                for fr in sys._current_frames().values():
                    f.write("".join(traceback.format_stack(fr)) + "\n----\n")
        os.kill(os.getpid(), signum)

    threading.Thread(target=fire, daemon=True).start()


def _digest(model, opt) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        for k, v in sorted(opt.state.get(p, {}).items()):
            h.update(k.encode())
            h.update(v.detach().numpy().tobytes() if hasattr(v, "numpy") else repr(v).encode())
    return h.hexdigest()[:16]


def worker(out: str, seed: int, signum: int, timeout_s: float) -> None:
    import torch

    import commrt
    from commrt.algorithms import BackupWorkers

    rng = random.Random(seed)
    # every fifth trial kills inside close(); the others inside a random step
    victim, kill_step = rng.randrange(RANKS), rng.randrange(1, STEPS + 1)
    if seed % 5 == 4:
        kill_step = STEPS + 1
    comm = commrt.init("gloo", timeout=timeout_s, abort_on_error=False)
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2048)  # 4.2 M parameters: 16 MB of fp32 gradients
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sync = commrt.GradientSync(model, comm, algorithm=BackupWorkers(backups=BACKUPS))
    gen = torch.Generator().manual_seed(1000 + comm.rank)
    rec = {"rank": comm.rank, "applied": 0, "slowest_step_s": 0.0}
    step_s = 0.3
    try:
        while sync.global_step < STEPS and not sync.policy.finished:
            t0 = time.perf_counter()
            if comm.rank == victim and sync.global_step + 1 == kill_step:
                _kill_later(rng.uniform(0, 1.2 * step_s), out, signum)
            x = torch.randn(16, 2048, generator=gen)
            model(x).pow(2).mean().backward()
            rec["applied"] += sync.step(opt)
            step_s = time.perf_counter() - t0
            rec["slowest_step_s"] = round(max(rec["slowest_step_s"], step_s), 2)
        if comm.rank == victim:  # not killed yet: die inside close()
            _kill_later(rng.uniform(0, 0.2), out, signum)
        WHERE["now"] = "close"
        t_close = time.perf_counter()
        sync.close()
        rec["close_s"] = round(time.perf_counter() - t_close, 2)
        WHERE["now"] = "closed"
        if comm.rank == victim:
            time.sleep(60)  # close() was quicker than the kill: it still comes
    except commrt.CommError as e:
        import traceback

        rec.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    rec.update(global_step=sync.global_step, digest=_digest(model, opt))
    with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(rec, f)
    comm.close()


# ----------------------------------------------------------------------------- the trials
def trial(seed: int, out: str, limit_s: float, signum: int, timeout_s: float) -> dict:
    from commrt.runtime.store import host_store

    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))
    store = host_store()  # torchrun's agent store, as the ranks of a torchrun job meet
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    env.update(WORLD_SIZE=str(RANKS), LOCAL_WORLD_SIZE=str(RANKS), OMP_NUM_THREADS="1")
    env.update(TORCHELASTIC_USE_AGENT_STORE="true", PYTHONUNBUFFERED="1")
    env.pop(settings.STORE.name, None)
    argv = [sys.executable, HERE, "--worker", out, str(seed), str(signum), str(timeout_s)]
    procs = [
        subprocess.Popen(
            argv,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(RANKS)
    ]
    t0 = time.monotonic()
    logs = [""] * RANKS
    readers = [threading.Thread(target=_read, args=(p, logs, r)) for r, p in enumerate(procs)]
    for t in readers:
        t.start()
    _wait_survivors(procs, t0 + limit_s)
    for r, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
            if not _stopped(p.pid):
                logs[r] += "\n[killed at the trial's limit]"
        p.wait()
    for t in readers:
        t.join()
    del store
    for r, log in enumerate(logs):  # whole, for a failure's traceback
        with open(os.path.join(out, f"rank{r}.log"), "w") as f:
            f.write(log)
    return _verdict(seed, out, [p.returncode for p in procs], logs, time.monotonic() - t0)


def _read(proc: subprocess.Popen, logs: list[str], rank: int) -> None:
    logs[rank] = proc.stdout.read()


def _stopped(pid: int) -> bool:
    from commrt.cli.tolerance import stopped_now

    return stopped_now(pid)


def _wait_survivors(procs: list[subprocess.Popen], deadline: float) -> None:
    """Until every process has ended or is stopped (a stopped victim), or ``deadline``."""
    while time.monotonic() < deadline:
        if all(p.poll() is not None or _stopped(p.pid) for p in procs):
            return
        time.sleep(0.2)


def _verdict(seed, out, codes, logs, wall_s) -> dict:
    dead = [r for r, c in enumerate(codes) if c == -signal.SIGKILL]
    recs = {}
    for r in range(RANKS):
        path = os.path.join(out, f"rank{r}.json")
        if os.path.exists(path):
            recs[r] = json.load(open(path))
    phase_file = os.path.join(out, "phase.txt")
    phase = open(phase_file).read() if os.path.exists(phase_file) else "none"
    live = [r for r in range(RANKS) if r not in dead]
    why = []
    if len(dead) != 1:
        why.append(f"exit codes {codes}")
    for r in live:
        rec = recs.get(r)
        if rec is None or codes[r] != 0:
            why.append(f"rank {r}: exit {codes[r]}, no report: {logs[r][-300:]!r}")
        elif "error" in rec:
            why.append(f"rank {r}: {rec['error']}")
        elif rec["global_step"] != STEPS or rec["applied"] != STEPS:
            why.append(f"rank {r}: global step {rec['global_step']}, applied {rec['applied']}")
    if len({recs[r]["digest"] for r in live if r in recs}) > 1:
        why.append("survivors differ")
    return {"seed": seed, "victim": dead, "phase": phase, "ok": not why, "why": why,
            "wall_s": round(wall_s, 1)}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--out", default="out/chaos")
    ap.add_argument("--limit-s", type=float, default=180.0, help="per trial (default 180)")
    ap.add_argument("--signal", choices=("kill", "stop"), default="kill", help="the victim's")
    ap.add_argument("--timeout", type=float, default=30.0, help="commrt.init's (default 30)")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        out, seed, signum, timeout_s = args.worker
        worker(out, int(seed), int(signum), float(timeout_s))
        return 0
    results = []
    print(f"{'trial':>5} {'victim':>6} {'phase':<10} {'result':<6} {'wall':>6}", flush=True)
    for i in range(args.trials):
        seed = args.first_seed + i
        signum = signal.SIGKILL if args.signal == "kill" else signal.SIGSTOP
        where = os.path.join(args.out, f"trial{seed}")
        res = trial(seed, where, args.limit_s, signum, args.timeout)
        results.append(res)
        verdict = "ok" if res["ok"] else "FAIL"
        victim = ",".join(map(str, res["victim"])) or "-"
        print(f"{seed:>5} {victim:>6} {res['phase']:<10} {verdict:<6} {res['wall_s']:>5.0f}s")
        for line in res["why"]:
            print(f"      {line[:72]}", flush=True)  # whole in trials.json
    phases = collections.Counter(r["phase"] for r in results)
    passed = sum(r["ok"] for r in results)
    print(f"passed {passed} of {len(results)}")
    kills = ", ".join(f"{k} {v}" for k, v in sorted(phases.items()))
    print(textwrap.fill(f"kills by phase: {kills}", 80, subsequent_indent="  "))
    with open(os.path.join(args.out, "trials.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
