"""GradientSync: equivalence with PyTorch DDP (real processes), failure modes,
bucketing, the trace timeline and overlap with backward (in-process ranks)."""

import json
import threading
import time

import pytest
import torch
from helpers.local_transport import run_ranks
from helpers.mp import mpiexec

import commrt
from commrt.cli.bench import DelayBackward
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator
from commrt.sync.buckets import assign_buckets

# Stated tolerances (per tensor, max|commrt - DDP| / max|DDP| after 20 SGD+momentum steps):
FP32_TOL = 1e-5
BF16_TOL = 2e-2  # bf16 wire: ~2^-8 relative rounding of every averaged gradient, 20 steps of it


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.slow
def test_matches_ddp_and_fails_safely(nranks, tmp_path):
    out = tmp_path / "report.json"
    mpiexec(nranks, "gradsync_worker.py", out, timeout=300)
    r = json.loads(out.read_text())
    cases = r["cases"]
    for name, c in cases.items():
        assert c["identical_across_ranks"], name
        assert c["buckets"] >= 3, name
        tol = BF16_TOL if name.startswith("bf16") else FP32_TOL
        assert c["rel_err"] <= tol, (name, c)
    assert set(cases) == {
        "fp32 mpi ring",
        "fp32 gloo halving_doubling",
        "fp32 mpi torus2d",
        "fp32 mpi no_sync accumulation",
        "bf16 wire mpi ring",
        "fp32 mpi ring, each rank seeded differently",
    }
    # models seeded per rank: rank 0's weights everywhere, bit for bit, right after construction
    assert r["same_start"] == {
        "differed_before": True,
        "identical_after": True,
        "equals_rank0_model": True,
    }
    assert (
        r["unused_zeros"]["identical_across_ranks"] and r["unused_zeros"]["branch_grad_is_average"]
    )
    # the error policy raises on every rank (rank 0 had all its gradients), naming each rank that
    # lacked some and the parameters, and no rank's optimizer stepped
    assert len(r["unused_error"]) == nranks
    for e in r["unused_error"]:
        assert e["message"] is not None and e["params_unchanged"], e
        for other in range(1, nranks):
            assert f"rank {other}: branch.bias, branch.weight" in e["message"], e
        assert "rank 0:" not in e["message"]
    for m in r["layout_mismatch"]:  # every rank raises, with both layouts in the message
        assert m["message"] and "gradient layouts differ across ranks" in m["message"]
        assert f"rank {nranks - 1}: 8 parameters" in m["message"]
    assert "GradientSync step is in flight" in r["guard"]


def _comm(tr, timeout=10.0):
    return Communicator(
        tr, Backend.GLOO, LaunchInfo("none", tr.rank, tr.world_size, 0, None), timeout, 1 << 20
    )


class Deep(torch.nn.Module):
    def __init__(self, slow=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(64, 256)
        self.mid = torch.nn.Linear(256, 256)
        self.last = torch.nn.Linear(256, 8)
        self.slow = slow

    def forward(self, x):
        h = torch.relu(self.first(x))
        if self.slow:
            h = DelayBackward.apply(h, self.slow)
        return self.last(torch.relu(self.mid(h)))


def test_buckets_reverse_order_first_small():
    model = Deep()
    named = list(model.named_parameters())
    # reverse registration order; fp32 wire: last.* 8.2 KB + mid.bias 1 KB fit the 10 KB first bucket,
    # mid.weight 256 KB + first.bias 1 KB fit 300 KB, first.weight 64 KB would not
    b = assign_buckets(named, bucket_bytes=300 * 1024, first_bucket_bytes=10 * 1024, element_size=4)
    assert [bk.names for bk in b] == [
        ("last.bias", "last.weight", "mid.bias"),
        ("mid.weight", "first.bias"),
        ("first.weight",),
    ]
    assert b[0].offsets == (0, 8, 8 + 8 * 256) and b[0].numel == 8 + 8 * 256 + 256
    big = assign_buckets(named, bucket_bytes=16 * 1024, first_bucket_bytes=1024, element_size=4)
    # weights above the cap get their own bucket; first.bias (1 KB < 16 KB / 8) is too small to travel
    # alone and rides with first.weight; the first bucket stays strictly under its 1 KB cap
    assert [bk.names for bk in big] == [
        ("last.bias",),
        ("last.weight", "mid.bias"),
        ("mid.weight",),
        ("first.bias", "first.weight"),
    ]


def test_trace_names_phases_and_overlap_with_backward(tmp_path):
    steps = 3

    def body(tr):
        comm = _comm(tr)
        model = Deep(slow=0.05)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sync = commrt.GradientSync(model, comm, bucket_mb=0.2, first_bucket_mb=0.01, trace=True)
        loop = []
        t_prev = sync.tracer.now_us()
        for _ in range(steps):
            x = torch.randn(32, 64)
            model(x).square().mean().backward()
            sync.step(opt)
            t = sync.tracer.now_us()
            loop.append((t_prev, t))
            t_prev = t
        path = sync.save_trace(tmp_path / f"rank{tr.rank}.json")
        stats = sync.stats
        sync.close()
        return path, loop, stats

    results = run_ranks(2, body)
    for rank, (path, loop, stats) in enumerate(results):
        data = json.loads(open(path).read())
        ev = [e for e in data["traceEvents"] if e["ph"] in ("X", "i")]
        names = {e["name"] for e in ev}
        for want in (
            "commrt/bucket0/ready",
            "commrt/bucket0/pack",
            "commrt/bucket0/comm",
            "commrt/bucket0/unpack",
            "commrt/ring/step0",
            "commrt/ring/step1",
            "commrt/backward",
            "commrt/wait",
            "commrt/optimizer",
            "commrt/compute",
        ):
            assert want in names, want
        assert all(e["pid"] == rank for e in ev)
        main_phases = [
            e for e in ev if e["name"] in ("commrt/compute", "commrt/wait", "commrt/optimizer")
        ]
        for s, (t0, t1) in list(enumerate(loop))[
            1:
        ]:  # step 0's compute also counts set-up since construction
            # the main-thread phases of step s tile the loop iteration exactly
            got = sum(e["dur"] for e in main_phases if e["args"]["step"] == s)
            assert abs(got - (t1 - t0)) <= 0.01 * (t1 - t0) + 50, (s, got, t1 - t0)
        # overlap: bucket 0's communication ends before backward produced its last gradient
        for s in range(1, steps):
            bw = next(e for e in ev if e["name"] == "commrt/backward" and e["args"]["step"] == s)
            comm0 = [e for e in ev if e["name"] == "commrt/bucket0/comm"][s]
            assert comm0["ts"] + comm0["dur"] < bw["ts"] + bw["dur"], (
                "bucket 0 did not overlap backward"
            )
        m = stats.mean()
        assert m.bytes_sent > 0 and m.comm_s > 0 and m.backward_s > 0.04


def test_trace_merge_cli(tmp_path):
    from commrt.cli import main
    from commrt.runtime.trace import Tracer

    paths = []
    for r in range(2):
        t = Tracer(rank=r)
        with t.span("commrt/bucket0/pack"):
            pass
        paths.append(t.save(tmp_path / f"r{r}.json"))
    out = tmp_path / "merged.json"
    assert main(["trace", "merge", "-o", str(out), *map(str, paths)]) == 0
    merged = json.loads(out.read_text())
    assert {e["pid"] for e in merged["traceEvents"] if e["ph"] == "X"} == {0, 1}


def test_usage_errors():
    def body(tr):
        comm = _comm(tr)
        model = Deep()
        with pytest.raises(ValueError, match="bucket_mb must be a positive"):
            commrt.GradientSync(model, comm, bucket_mb=0)
        for bad in (float("inf"), float("nan"), True, "1"):
            with pytest.raises(ValueError, match="first_bucket_mb must be a positive"):
                commrt.GradientSync(model, comm, first_bucket_mb=bad)
        with pytest.raises(ValueError, match="bucket_mb is less than one byte.*got 1e-09"):
            commrt.GradientSync(model, comm, bucket_mb=1e-9)  # came to 0 bytes: a vague error
        with pytest.raises(ValueError, match="comm_dtype must be one of"):
            commrt.GradientSync(model, comm, comm_dtype=torch.int32)
        with pytest.raises(ValueError, match="unused must be 'zeros' or 'error'"):
            commrt.GradientSync(model, comm, unused="ignore")
        with pytest.raises(ValueError, match="no parameters that require grad"):
            commrt.GradientSync(torch.nn.ReLU(), comm)
        with pytest.raises(TypeError, match="commrt.Communicator"):
            commrt.GradientSync(model, "comm")
        sync = commrt.GradientSync(model, comm)
        model(torch.randn(4, 64)).sum().backward()
        with pytest.raises(RuntimeError, match="got a second gradient before sync.wait"):
            model(torch.randn(4, 64)).sum().backward()
        sync.wait()
        with pytest.raises(RuntimeError, match="wait\\(\\) inside no_sync"):
            with sync.no_sync():
                sync.wait()
        sync.close()
        sync.close()  # idempotent
        # closed: backward leaves local gradients, and a step says why instead of timing out
        model(torch.randn(4, 64)).sum().backward()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for call in (lambda: sync.step(opt), lambda: sync.join(opt)):
            t0 = time.perf_counter()
            with pytest.raises(RuntimeError, match="on a closed GradientSync"):
                call()
            assert time.perf_counter() - t0 < 1.0

    run_ranks(1, body)


def test_a_step_waits_at_the_longest_timeout_whatever_the_buckets():
    """wait()'s backstop is the timeout times (buckets + 2): at --timeout 3e9 (and at
    MAX_TIMEOUT_S with 91 buckets or more) it passed threading.TIMEOUT_MAX, and the wait
    raised "OverflowError: timestamp out of range for platform time_t" (new-user trial)."""
    from types import SimpleNamespace

    from commrt.process.rendezvous import MAX_TIMEOUT_S
    from commrt.sync.progress import ProgressThread
    from commrt.sync.step_state import StepState

    state = StepState.fresh([SimpleNamespace(params=[None])], step=0)
    progress = ProgressThread(state, SimpleNamespace(cuda=False), policy=None, name="test")

    def finish():  # the progress thread's part: the one bucket is done
        time.sleep(0.05)
        with progress.cv:
            state.done = 1
            progress.cv.notify_all()

    threading.Thread(target=finish).start()
    with progress.cv:
        progress.wait_done(MAX_TIMEOUT_S * 202, rank=0, algorithm="ring")
    assert state.done == 1


def test_no_sync_accumulates_then_averages():
    # models are built here, not in the rank threads: torch's global RNG is shared by threads
    models = [Deep() for _ in range(2)]
    refs = [Deep() for _ in range(2)]
    xs = [
        [torch.randn(4, 64, generator=torch.Generator().manual_seed(10 * r + k)) for k in range(2)]
        for r in range(2)
    ]

    def body(tr):
        comm = _comm(tr)
        model, ref, x = models[tr.rank], refs[tr.rank], xs[tr.rank]
        sync = commrt.GradientSync(model, comm)
        with sync.no_sync():
            model(x[0]).sum().backward()
        model(x[1]).sum().backward()
        sync.wait()
        sync.close()
        ref(x[0]).sum().backward()
        ref(x[1]).sum().backward()
        return [p.grad.clone() for p in model.parameters()], [
            p.grad.clone() for p in ref.parameters()
        ]

    out = run_ranks(2, body)
    for i in range(len(out[0][0])):
        want = (out[0][1][i] + out[1][1][i]) / 2
        for r in range(2):
            torch.testing.assert_close(out[r][0][i], want, rtol=1e-6, atol=1e-6)


def test_grad_views_live_in_the_bucket_and_survive_set_to_none():
    models = [Deep() for _ in range(2)]
    xs = [torch.randn(4, 64, generator=torch.Generator().manual_seed(r)) for r in range(2)]

    def body(tr):
        comm = _comm(tr)
        model = models[tr.rank]
        opt = torch.optim.SGD(
            model.parameters(), lr=0.0
        )  # lr 0: parameters stay, grads are what we check
        sync = commrt.GradientSync(model, comm, bucket_mb=0.2, first_bucket_mb=0.01)
        bf16 = commrt.GradientSync(Deep(), comm, comm_dtype=torch.bfloat16)
        # a bf16 wire for fp32 parameters: the gradients are views too, of an fp32 bucket
        # apart from the wire buffer
        inside = all(v is not None for v in sync._views + bf16._views)
        inside = inside and all(w is not f for w, f in zip(bf16._buffers, bf16.io.flats))
        bf16.close()

        def in_buffer(p):
            return any(
                buf.data_ptr() <= p.grad.data_ptr() < buf.data_ptr() + buf.numel() * 4
                for buf in sync._buffers
            )

        out = []
        for mode in ("in place", "set to none"):
            model(xs[tr.rank]).sum().backward()
            sync.wait()
            out.append([p.grad.clone() for p in model.parameters()])
            views_kept = all(in_buffer(p) for p in model.parameters())
            if mode == "in place":
                opt.step()
                opt.zero_grad(set_to_none=False)
            else:
                opt.zero_grad(set_to_none=True)  # the user's own zero_grad: grads become None
        model(xs[tr.rank]).sum().backward()  # fresh autograd tensors, copied in at pack time
        sync.wait()
        out.append([p.grad.clone() for p in model.parameters()])
        views_back = all(in_buffer(p) for p in model.parameters())
        sync.close()
        return inside, views_kept, views_back, out

    res = run_ranks(2, body)
    ref = [Deep() for _ in range(2)]
    for r in range(2):
        ref[r](xs[r]).sum().backward()
    want = [(a.grad + b.grad) / 2 for a, b in zip(ref[0].parameters(), ref[1].parameters())]
    for inside, views_kept, views_back, out in res:
        assert inside and views_kept and views_back
        for step_grads in out:
            for g, w in zip(step_grads, want):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
