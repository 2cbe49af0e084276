"""commrt.kernels compiled for a GPU (the other tests run them in Triton's interpreter).

tests/conftest.py sets TRITON_INTERPRET=1 for the whole session, and Triton
reads it once, at import. So each check here runs this file as a script in a
child process with TRITON_INTERPRET removed from its environment.

* ``test_kernels_compile_for_sm90`` needs no GPU: it compiles the kernels
  ahead of time for an H100 target (sm_90) with the ptxas shipped in the
  Triton wheel, and checks the PTX: aligned full blocks use 16-byte vector
  loads and stores (the pointer-table hints work), and no FMA contraction
  (so GPU rounding matches the interpreter's). It checks code generation
  only, not speed or results on a GPU.
* ``test_triton_on_cuda_matches_torch_and_float64`` runs the kernels on a
  CUDA device: Triton vs the torch path vs float64, every dtype pair, the
  first (autotuning) call included. Skipped where there is no CUDA GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

HERE = os.path.abspath(__file__)


def _run_child(mode: str, timeout: int = 600) -> str:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, HERE, mode], env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"child '{mode}' failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout


def _has_nvidia_backend() -> bool:
    try:
        import triton.backends.nvidia.compiler  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(
    not _has_nvidia_backend(), reason="Triton's NVIDIA backend (ptxas) is not installed"
)
def test_kernels_compile_for_sm90():
    out = _run_child("compile", timeout=300)
    assert "compiled" in out, out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_triton_on_cuda_matches_torch_and_float64():
    out = _run_child("cuda")
    assert "cuda ok" in out, out


def test_gpu_launch_takes_the_size_heuristics_config(monkeypatch):
    """The GPU launch path (run here with stand-ins for the kernels): every launch goes
    straight to the kernel with the configuration of its size, no autotuner, no trials."""
    from commrt.kernels import _triton as K
    from commrt.kernels.configs import LARGE, LARGE_FROM, SMALL

    calls = []

    class Fn:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    dev, x32 = torch.device("cuda", 0), torch.empty(4)
    for numel in (1, LARGE_FROM - 1, LARGE_FROM, 1 << 26):
        K._launch(Fn(), lambda block: (7, block), (x32, 2.0), {"OUT_CODE": 0}, numel, dev)
    want = [SMALL, SMALL, LARGE, LARGE]
    assert [c[0] for c in calls] == [(7, cfg.block) for cfg in want]
    assert [c[2] for c in calls] == [
        {"OUT_CODE": 0, "BLOCK": c.block, "num_warps": c.num_warps, "enable_fp_fusion": False}
        for c in want
    ]
    assert all(c[1] == (x32, 2.0) for c in calls)


# ----------------------------------------------------------------------------
# child-process bodies
# ----------------------------------------------------------------------------


def _compile_check() -> None:
    import triton
    from triton.backends.compiler import GPUTarget

    from commrt.kernels import _triton as K

    assert not K.interpret_mode()
    target = GPUTarget("cuda", 90, 32)
    div16 = [["tt.divisibility", 16]]  # what Triton infers for 16-byte-aligned pointers / ints

    def ptx_of(fn, sig, consts, aligned_args):
        attrs = {(fn.arg_names.index(a),): div16 for a in aligned_args}
        src = triton.compiler.ASTSource(fn, sig, constexprs=consts, attrs=attrs)
        opts = {"num_warps": 4, "enable_fp_fusion": False}
        return triton.compile(src, target=target, options=opts).asm["ptx"]

    tabs = ["flat_off", "numel", "dtype_code", "chunk_first", "chunk_owner"]
    scalars = {"scale": "fp32", "chunk": "i32"}
    pack_sig = {
        "src_addr": "*i64",
        **{t: "*i64" for t in tabs},
        "out": "*bf16",
        **scalars,
        "SRC_CODE": "constexpr",
        "OUT_CODE": "constexpr",
        "ALIGNED": "constexpr",
        "BLOCK": "constexpr",
    }
    unpack_sig = {
        "flat": "*bf16",
        "dst_addr": "*i64",
        **{t: "*i64" for t in tabs},
        **scalars,
        "DST_CODE": "constexpr",
        "ACCUMULATE": "constexpr",
        "ALIGNED": "constexpr",
        "BLOCK": "constexpr",
    }
    reduce_sig = {
        "dst": "*fp32",
        "src": "*bf16",
        "n": "i32",
        "alpha": "fp32",
        "beta": "fp32",
        "DST_CODE": "constexpr",
        "BLOCK": "constexpr",
    }
    aligned_pack = ["src_addr", *tabs, "out", "chunk"]
    aligned_unpack = ["flat", "dst_addr", *tabs, "chunk"]

    def vec(ptx, op):
        return re.search(op + r"(\.\w+)*\.v4", ptx) is not None

    for src_code in (0, 1, 2, 3):  # fp32, fp16, bf16 sources, and a mixed list
        for aligned in (True, False):
            ptx = ptx_of(
                K._pack_kernel,
                pack_sig,
                {"SRC_CODE": src_code, "OUT_CODE": 2, "ALIGNED": aligned, "BLOCK": 2048},
                aligned_pack,
            )
            if aligned:
                assert vec(ptx, "ld.global") and vec(ptx, "st.global"), (
                    f"pack src {src_code}: no vector access"
                )
            assert "fma" not in ptx
    for dst_code in (0, 2, 3):
        for acc in (False, True):
            ptx = ptx_of(
                K._unpack_kernel,
                unpack_sig,
                {"DST_CODE": dst_code, "ACCUMULATE": acc, "ALIGNED": True, "BLOCK": 2048},
                aligned_unpack,
            )
            assert vec(ptx, "ld.global") and vec(ptx, "st.global"), (
                f"unpack dst {dst_code}: no vector access"
            )
            assert "fma" not in ptx
    # n is not specialized (one kernel for every size): full blocks still load by vectors
    ptx = ptx_of(K._reduce_kernel, reduce_sig, {"DST_CODE": 0, "BLOCK": 4096}, ["dst", "src"])
    assert vec(ptx, "ld.global") and vec(ptx, "st.global") and "fma" not in ptx
    print("compiled: pack x8, unpack x6, reduce x1 for sm_90")


def _cuda_check() -> None:
    import itertools
    import math

    from commrt.kernels import _triton as K
    from commrt.kernels import pack, reduce_, unpack

    assert not K.interpret_mode()
    dev = torch.device("cuda")
    dts = [torch.float32, torch.float16, torch.bfloat16]
    half_ulp = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
    tiny = {torch.float32: 2.0**-149, torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133}
    f32 = lambda x: torch.tensor(x, dtype=torch.float32).item()  # noqa: E731
    gen = torch.Generator().manual_seed(0)

    def rand(n, dt):
        mag = torch.exp2(torch.randint(-6, 7, (n,), generator=gen).float())
        return (torch.randn(n, generator=gen) * mag).to(dt).to(dev)

    def check(got, ref, mag, dt, what):
        # absolute slack of dt's smallest subnormal for results that underflow (as tests/unit/test_kernels.py)
        bound = (3 * 2.0**-24 + half_ulp[dt]) * mag * 1.01 + tiny[dt]
        err = (got.double() - ref).abs()
        bad = (err > bound).nonzero().flatten()
        if bad.numel():
            i = int(bad[0])
            raise AssertionError(
                f"{what}: {bad.numel()} of {ref.numel()} elements out of bound, first at {i}: "
                f"got {got[i].item()!r}, float64 reference {ref[i].item()!r}, "
                f"bound {bound[i].item():.3g}; max err {err.max().item()}"
            )

    launches = []
    real = K._launch
    K._launch = lambda *a, **k: (launches.append(a[0]), real(*a, **k))
    sizes = [0, 1, 3, 1023, 1025, 100_003, 4_000_037]
    for src, dst in itertools.product(dts, dts):
        for scale in (1.0, 0.3):
            # pack: aligned list (offsets multiple of 8) and a ragged one
            for shapes in ([(1024,), (4096,), (100_000,)], [(s,) for s in sizes]):
                ts = [rand(math.prod(s), src) for s in shapes]
                total = sum(t.numel() for t in ts)
                outs = {}
                for impl in ("triton", "torch"):
                    out = torch.full((total + 3,), float("nan"), dtype=dst, device=dev)
                    pack(ts, out, scale, impl=impl)
                    assert out[total:].isnan().all()
                    outs[impl] = out[:total]
                ref = torch.cat([t.double() for t in ts]) * f32(scale)
                check(outs["triton"], ref, ref.abs(), dst, f"pack {src}->{dst}")
                assert torch.equal(outs["triton"], outs["torch"]), (
                    f"pack {src}->{dst} triton != torch"
                )
            # unpack, accumulate included; a fresh size forces the autotuner (it must restore dsts)
            for acc in (False, True):
                n_list = [1025, 3, 100_003 + int(scale * 10) + (7 if acc else 0)]
                flat = rand(sum(n_list), src)
                init = [rand(n, dst) for n in n_list]
                res = {}
                for impl in ("triton", "torch"):
                    d = [x.clone() for x in init]
                    unpack(flat, d, scale, accumulate=acc, impl=impl)
                    res[impl] = d
                off = 0
                for i, x0 in enumerate(init):
                    xs = flat[off : off + x0.numel()].double() * f32(scale)
                    off += x0.numel()
                    ref = x0.double() + xs if acc else xs
                    mag = x0.double().abs() + xs.abs() if acc else ref.abs()
                    check(res["triton"][i], ref, mag, dst, f"unpack {src}->{dst} acc={acc}")
                    if not acc:
                        assert torch.equal(res["triton"][i], res["torch"][i])
        for a, b in ((1.0, 1.0), (0.3, 1.7)):
            n = 1_000_003 + dts.index(src)  # fresh sizes: autotuning must restore dst
            d0, s = rand(n, dst), rand(n, src)
            d = d0.clone()
            reduce_(d, s, alpha=a, beta=b, impl="triton")
            ref = f32(a) * d0.double() + f32(b) * s.double()
            check(
                d,
                ref,
                (f32(a) * d0.double()).abs() + (f32(b) * s.double()).abs(),
                dst,
                f"reduce {dst}+={src}",
            )
    # auto dispatch picks Triton for CUDA tensors; a mixed list is one launch
    launches.clear()
    pack([rand(10, torch.float32), rand(10, torch.bfloat16)], torch.empty(20, device=dev))
    assert launches == [K._pack_kernel], launches
    # in place on sizes not seen yet: the autotuner's trials run on these very tensors and
    # must be undone (distributed/ops.py averages with pack([flat], flat, scale=1/p))
    for n in (777_777, 1_234_567):
        x = rand(n, torch.float32)
        flat = x.clone()
        pack([flat], flat, 0.5)
        assert torch.equal(flat, x * 0.5), "in-place pack applied more than once"
        flat = x.clone()
        unpack(flat, list(flat.split([n // 3, n - n // 3])), 0.5, accumulate=True)
        assert torch.equal(flat, x + x * 0.5), "in-place unpack applied more than once"
    _side_stream_holds_sources(rand)
    _a_new_table_never_waits_on_the_host(rand)
    torch.cuda.synchronize()
    print("cuda ok")


def _a_new_table_never_waits_on_the_host(rand):
    """A pack of a list not seen before copies a new pointer table to the GPU: from pinned
    memory, with no host wait for the stream (a pageable copy waits, and on the torch
    backend's call thread that is a CUDA call waiting for the device between NCCL launches
    while another thread drives a pair communicator). torch raises on a synchronising
    call in sync-debug mode "error"."""
    from commrt.kernels import pack

    sizes = [1000, 3000]
    out = torch.empty(sum(sizes), device="cuda")
    warm = [rand(n, torch.float32) for n in sizes]  # alive: fresh gets other addresses
    pack(warm, out)  # the first launch of these sizes may synchronise
    fresh = [rand(n, torch.float32) for n in sizes]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pack(fresh, out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out, torch.cat(fresh)), "a pack through a new table packed wrong"


def _side_stream_holds_sources(rand):
    """On a side stream a launch holds its sources until the stream passes it (the kernel
    reads them through its table, which the allocator cannot see); on the default stream,
    where they were made, nothing is held."""
    import gc
    import weakref

    from commrt.kernels import lifetime, pack

    torch.cuda.synchronize()
    assert lifetime.held() == 0
    src = rand(1 << 20, torch.float32)
    out = torch.empty_like(src)
    pack([src], out, 0.5)
    assert lifetime.held() == 0, "a pack on the default stream held its sources"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1 << 30)  # keeps the side stream busy while the host looks
        pack([src], out, 0.5)
    ref = weakref.ref(src)
    del src
    gc.collect()
    assert lifetime.held() == 1 and ref() is not None, "a side-stream pack let its source go"
    side.synchronize()
    assert lifetime.held() == 0, "the hold outlived the stream's pass"
    gc.collect()
    assert ref() is None, "the source was kept after the stream passed the pack"


if __name__ == "__main__":
    {"compile": _compile_check, "cuda": _cuda_check}[sys.argv[1]]()
