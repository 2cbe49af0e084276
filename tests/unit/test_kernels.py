"""commrt.kernels: Triton kernels (TRITON_INTERPRET=1, CPU) vs torch reference vs float64.

Every case runs the same inputs through three computations:

* ``impl="triton"`` -- the @triton.jit kernels, run by Triton's interpreter
  on CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1);
* ``impl="torch"`` -- the reference path that CPU tensors use in production;
* a float64 reference computed here from the definition.

Outputs are pre-filled with a NaN sentinel (and ``out`` has extra elements
past the packed total), so an element a kernel forgets to write, or writes
out of range, fails the test.

Tolerances (vs the float64 reference)
-------------------------------------
``h(dt)`` is the half-ulp relative rounding error of dtype dt: fp32 2**-24,
fp16 2**-11, bf16 2**-8 (unit roundoff). ``tiny(dt)`` is dt's smallest
subnormal (absolute slack for results that underflow).

* pack / unpack: ``|got - ref| <= (2**-24 + h(dst)) * |ref| * 1.01 + tiny(dst)``
  -- one fp32 rounding of ``x * scale`` plus one rounding to the destination
  dtype. ``ref`` uses the fp32 value of ``scale``, since the contract is
  "multiply in fp32".
* accumulate / reduce_: ``|got - ref| <= (3 * 2**-24 + h(dst)) *
  (|a * dst| + |b * src|) * 1.01 + tiny(dst)`` -- up to three fp32 roundings
  (two products, one sum) and one rounding to dst's dtype, measured against
  the operands' magnitude because the sum may cancel.

Exact equality is required where the math is exact: fp32 -> fp32 with a
power-of-two scale (pack, unpack, accumulate), and reduce_ into fp32 with
power-of-two weights. Triton and torch must also agree *bit for bit* for
pack and non-accumulating unpack (both round the same fp32 product once);
for accumulate / reduce_ they may differ by the fp32 roundings above (the
torch CPU kernels may fuse multiply-add), so they are held to twice the bound.
"""

from __future__ import annotations

import itertools
import math
import types

import pytest
import torch

from commrt.kernels import SUPPORTED_DTYPES, Impl, _common, _torch, lifetime, pack, reduce_, unpack

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPES = [F32, F16, BF16]
PAIRS = list(itertools.product(DTYPES, DTYPES))
SMALL_SIZES = [0, 1, 3, 1023, 1025]
BIG = 100_003
# one list that mixes every size (and a 2-D and a 3-D tensor), 100 003 included
MIXED_SHAPES = [(1023,), (0,), (BIG,), (1,), (3, 341), (3,), (1025,), (2, 0, 5), (7, 11, 13)]

HALF_ULP = {F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8}
TINY = {F32: 2.0**-149, F16: 2.0**-24, BF16: 2.0**-133}
U32 = 2.0**-24

_triton = _common.triton_backend()
needs_interpreter = pytest.mark.skipif(
    _triton is None or not _triton.interpret_mode(),
    reason="Triton kernels run here only under TRITON_INTERPRET=1 (CUDA runs: tests/gpu/test_kernels_gpu.py)",
)


def dname(dt):
    return str(dt).replace("torch.", "")


def f32(x: float) -> float:
    """The fp32 value of a Python float (the value the kernels multiply by)."""
    return torch.tensor(x, dtype=F32).item()


def rand(shape, dtype, seed):
    """Values of mixed magnitude (2**-6 .. 2**6 times N(0,1)) that fit fp16 after scaling."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    mag = torch.exp2(torch.randint(-6, 7, (n,), generator=g).float())
    return (torch.randn(n, generator=g) * mag).reshape(shape).to(dtype)


def sentinel(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def assert_within(got, ref, bound, what):
    """|got - ref| <= bound elementwise (all float64); NaN in got fails."""
    got = got.double().reshape(-1)
    ref = ref.reshape(-1)
    bound = bound.reshape(-1)
    err = (got - ref).abs()
    bad = ~(err <= bound)  # NaN -> bad
    if bad.any():
        i = int(bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{got.numel()} elements out of tolerance; first at {i}: "
            f"got {got[i].item()!r}, ref {ref[i].item()!r}, |err| {err[i].item():.3g} > {bound[i].item():.3g}"
        )


def pack_bound(ref, dt):
    return (U32 + HALF_ULP[dt]) * ref.abs() * 1.01 + TINY[dt]


def acc_bound(mag, dt):
    return (3 * U32 + HALF_ULP[dt]) * mag * 1.01 + TINY[dt]


def is_pow2(x: float) -> bool:
    m, _ = math.frexp(x)
    return x > 0 and m == 0.5


# ----------------------------------------------------------------------------
# pack
# ----------------------------------------------------------------------------


def run_pack(shapes, src_dtypes, out_dtype, scale, seed=0, pad=5):
    """Pack with triton and torch; check both against float64; return (triton_out, torch_out, total)."""
    tensors = [rand(s, dt, seed + i) for i, (s, dt) in enumerate(zip(shapes, src_dtypes))]
    total = sum(t.numel() for t in tensors)
    outs = {}
    for impl in ("triton", "torch"):
        out = sentinel((total + pad,), out_dtype)
        ret = pack(tensors, out, scale=scale, impl=impl)
        assert ret is out
        assert out[total:].isnan().all(), f"{impl}: wrote past the packed total"
        outs[impl] = out[:total]
    ref = (
        torch.cat([t.double().reshape(-1) for t in tensors]) * f32(scale)
        if tensors
        else torch.zeros(0, dtype=torch.float64)
    )
    for impl, got in outs.items():
        assert_within(
            got,
            ref,
            pack_bound(ref, out_dtype),
            f"pack[{impl}] {[dname(d) for d in set(src_dtypes)]}->{dname(out_dtype)}",
        )
        if out_dtype == F32 and set(src_dtypes) <= {F32} and is_pow2(scale):
            assert torch.equal(got, ref.to(F32)), f"pack[{impl}] fp32->fp32 * 2^k must be exact"
    assert torch.equal(outs["triton"], outs["torch"]), (
        "triton and torch pack must agree bit for bit"
    )
    return outs["triton"], outs["torch"], total


@needs_interpreter
@pytest.mark.parametrize("scale", [1.0, 0.3], ids=["scale1", "scale0.3"])
@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{dname(a)}->{dname(b)}" for a, b in PAIRS])
def test_pack_sizes(src, dst, scale):
    for n in SMALL_SIZES:
        run_pack([(n,)], [src], dst, scale, seed=n)
    run_pack(MIXED_SHAPES, [src] * len(MIXED_SHAPES), dst, scale, seed=7)


@needs_interpreter
@pytest.mark.parametrize("scale", [1.0, 0.25, 2.0**-20, 8.0])
def test_pack_fp32_power_of_two_scale_is_exact(scale):
    # run_pack asserts exact equality with float64 for fp32 -> fp32 and 2^k scales
    run_pack([(3,), (1025,), (1023,), (1,), (0,), (4096,)], [F32] * 6, F32, scale, seed=3)


@needs_interpreter
@pytest.mark.parametrize("dst", DTYPES, ids=dname)
def test_pack_mixed_source_dtypes_one_launch(dst, monkeypatch):
    launches = []
    real = _triton._launch
    monkeypatch.setattr(_triton, "_launch", lambda *a, **k: (launches.append(a[0]), real(*a, **k)))
    shapes = [(1025,), (3,), (1023,), (0,), (17, 3), (1,), (5000,)]
    dtypes = [F32, F16, BF16, F16, BF16, F32, F16]
    run_pack(shapes, dtypes, dst, 0.3, seed=11)
    assert launches == [_triton._pack_kernel], "a mixed-dtype list must still be ONE launch"


@needs_interpreter
def test_pack_same_dtype_list_is_one_launch(monkeypatch):
    launches = []
    real = _triton._launch
    monkeypatch.setattr(_triton, "_launch", lambda *a, **k: (launches.append(a[0]), real(*a, **k)))
    run_pack([(10,), (20000,), (1,)], [BF16] * 3, F32, 0.5)
    assert len(launches) == 1


# ----------------------------------------------------------------------------
# unpack
# ----------------------------------------------------------------------------


def run_unpack(shapes, flat_dtype, dst_dtypes, scale, accumulate, seed=0, pad=5):
    total = sum(math.prod(s) for s in shapes)
    flat = torch.cat([rand((total,), flat_dtype, seed), sentinel((pad,), flat_dtype)])
    init = [rand(s, dt, seed + 100 + i) for i, (s, dt) in enumerate(zip(shapes, dst_dtypes))]
    got = {}
    for impl in ("triton", "torch"):
        dsts = [t.clone() if accumulate else sentinel(t.shape, t.dtype) for t in init]
        unpack(flat, dsts, scale=scale, accumulate=accumulate, impl=impl)
        got[impl] = dsts
    x = flat[:total].double() * f32(scale)
    off = 0
    exact = flat_dtype == F32 and set(dst_dtypes) <= {F32} and is_pow2(scale)
    for i, t0 in enumerate(init):
        n = t0.numel()
        xi = x[off : off + n].reshape(t0.shape)
        off += n
        ref = t0.double() + xi if accumulate else xi
        bound = (
            acc_bound(t0.double().abs() + xi.abs(), t0.dtype)
            if accumulate
            else pack_bound(ref, t0.dtype)
        )
        for impl in ("triton", "torch"):
            g = got[impl][i]
            assert g.dtype == t0.dtype and g.shape == t0.shape
            what = f"unpack[{impl}] {dname(flat_dtype)}->{dname(t0.dtype)} acc={accumulate} tensor {i} {tuple(t0.shape)}"
            assert_within(g, ref, bound, what)
            if exact:  # 2^k * x is exact; the fp32 sum is rounded once, so equals fp32(exact sum)
                assert torch.equal(g, ref.to(g.dtype)), what + ": must be exact"
        a, b = got["triton"][i], got["torch"][i]
        if accumulate:
            assert_within(a, b.double(), 2 * bound, f"unpack acc triton vs torch, tensor {i}")
        else:
            assert torch.equal(a, b), f"unpack triton vs torch must agree bit for bit, tensor {i}"


@needs_interpreter
@pytest.mark.parametrize("accumulate", [False, True], ids=["copy", "accumulate"])
@pytest.mark.parametrize("scale", [1.0, 0.3], ids=["scale1", "scale0.3"])
@pytest.mark.parametrize("flat,dst", PAIRS, ids=[f"{dname(a)}->{dname(b)}" for a, b in PAIRS])
def test_unpack_sizes(flat, dst, scale, accumulate):
    for n in SMALL_SIZES:
        run_unpack([(n,)], flat, [dst], scale, accumulate, seed=n)
    run_unpack(MIXED_SHAPES, flat, [dst] * len(MIXED_SHAPES), scale, accumulate, seed=5)


@needs_interpreter
@pytest.mark.parametrize("accumulate", [False, True], ids=["copy", "accumulate"])
@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0**-12])
def test_unpack_fp32_power_of_two_scale_is_exact(scale, accumulate):
    run_unpack(
        [(3,), (1025,), (1023,), (1,), (0,), (4096,)], F32, [F32] * 6, scale, accumulate, seed=9
    )


@needs_interpreter
@pytest.mark.parametrize("accumulate", [False, True], ids=["copy", "accumulate"])
@pytest.mark.parametrize("flat", DTYPES, ids=dname)
def test_unpack_mixed_destination_dtypes_one_launch(flat, accumulate, monkeypatch):
    launches = []
    real = _triton._launch
    monkeypatch.setattr(_triton, "_launch", lambda *a, **k: (launches.append(a[0]), real(*a, **k)))
    shapes = [(1025,), (3,), (1023,), (0,), (17, 3), (1,), (5000,)]
    dtypes = [F16, F32, BF16, F16, BF16, F32, F16]
    run_unpack(shapes, flat, dtypes, 0.3, accumulate, seed=13)
    assert launches == [_triton._unpack_kernel]


@needs_interpreter
def test_pack_unpack_roundtrip_restores_gradients():
    grads = [rand(s, F32, i) for i, s in enumerate([(64, 3, 3), (64,), (10, 1000), (1,)])]
    keep = [g.clone() for g in grads]
    bucket = torch.empty(sum(g.numel() for g in grads), dtype=F32)
    pack(grads, bucket, scale=0.25, impl="triton")
    for g in grads:
        g.fill_(float("nan"))
    unpack(bucket, grads, scale=4.0, impl="triton")
    for g, k in zip(grads, keep):
        assert torch.equal(g, k)


# ----------------------------------------------------------------------------
# reduce_
# ----------------------------------------------------------------------------

WEIGHTS = [(1.0, 1.0), (0.5, 0.5), (0.3, 1.7)]


def run_reduce(n, dst_dtype, src_dtype, alpha, beta, seed=0):
    d0 = rand((n,), dst_dtype, seed)
    s = rand((n,), src_dtype, seed + 1)
    got = {}
    for impl in ("triton", "torch"):
        d = d0.clone()
        ret = reduce_(d, s, alpha=alpha, beta=beta, impl=impl)
        assert ret is d
        got[impl] = d
    a, b = f32(alpha), f32(beta)
    ref = a * d0.double() + b * s.double()
    bound = acc_bound(a * d0.double().abs() + b * s.double().abs(), dst_dtype)
    for impl, g in got.items():
        what = f"reduce_[{impl}] dst {dname(dst_dtype)} src {dname(src_dtype)} a={alpha} b={beta} n={n}"
        assert_within(g, ref, bound, what)
        if dst_dtype == F32 and is_pow2(alpha) and is_pow2(beta):
            # products exact, fp32 sum of two fp32 values rounded once == fp32(exact sum)
            assert torch.equal(g, ref.float()), what + ": must be exact"
    if is_pow2(alpha) and is_pow2(beta):
        assert torch.equal(got["triton"], got["torch"]), (
            "exact products: triton and torch must agree"
        )
    else:
        assert_within(got["triton"], got["torch"].double(), 2 * bound, "reduce_ triton vs torch")


@needs_interpreter
@pytest.mark.parametrize("alpha,beta", WEIGHTS, ids=[f"a{a}b{b}" for a, b in WEIGHTS])
@pytest.mark.parametrize("dst,src", PAIRS, ids=[f"dst_{dname(a)}-src_{dname(b)}" for a, b in PAIRS])
def test_reduce(dst, src, alpha, beta):
    for n in SMALL_SIZES + [BIG]:
        run_reduce(n, dst, src, alpha, beta, seed=n)


@needs_interpreter
def test_reduce_accepts_same_numel_other_shapes():
    d = rand((4, 5), F32, 0)
    s = rand((20,), BF16, 1)
    want = d.double() + s.double().reshape(4, 5)
    reduce_(d, s, impl="triton")
    assert d.shape == (4, 5)
    assert torch.equal(d, want.float())


# ----------------------------------------------------------------------------
# rounding edge cases, block / chunk edges
# ----------------------------------------------------------------------------


def _ties():
    """fp32 values exactly halfway between two fp16 / bf16 neighbours, plus extremes."""
    k = torch.arange(0, 64, dtype=torch.float64)
    bf16_ties = 1.0 + k * 2.0**-7 + 2.0**-8  # halfway between bf16 neighbours in [1, 2)
    fp16_ties = 1.0 + k * 2.0**-10 + 2.0**-11
    special = torch.tensor(
        [
            0.0,
            -0.0,
            float("inf"),
            -float("inf"),
            3.0e38,
            -3.0e38,
            7.0e4,
            65519.0,
            65520.0,
            1e-8,
            2.0**-25,
            3 * 2.0**-26,
            1e-40,
            -1e-40,
        ],
        dtype=torch.float64,
    )
    return torch.cat([bf16_ties, -bf16_ties, fp16_ties, -fp16_ties, special]).float()


@needs_interpreter
@pytest.mark.filterwarnings(
    "ignore:overflow encountered in cast:RuntimeWarning"
)  # 7e4 -> fp16 inf, on purpose
@pytest.mark.parametrize("dst", [F16, BF16], ids=dname)
def test_pack_rounds_to_nearest_even_like_torch(dst):
    x = _ties()
    want = x.to(dst)  # torch's casts are round-to-nearest-even
    for impl in ("triton", "torch"):
        out = sentinel((x.numel(),), dst)
        pack([x], out, impl=impl)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), impl


@needs_interpreter
def test_pack_keeps_nan():
    x = torch.tensor([1.0, float("nan"), -2.0])
    for dst in DTYPES:
        out = torch.zeros(3, dtype=dst)
        pack([x], out, scale=0.5, impl="triton")
        assert out[1].isnan() and out[0] == 0.5 and out[2] == -1.0


@needs_interpreter
def test_tiny_blocks_and_chunks(monkeypatch):
    """Block 16 / chunk 48: many chunk and block edges on small, fast inputs."""
    monkeypatch.setattr(_triton, "INTERPRET_BLOCK", 16)
    monkeypatch.setattr(_triton, "INTERPRET_CHUNK", 48)
    shapes = [(n,) for n in (0, 1, 3, 15, 16, 17, 47, 48, 49, 95, 96, 97, 200)]
    for src, dst in [(F32, BF16), (BF16, F32), (F16, F16)]:
        run_pack(shapes, [src] * len(shapes), dst, 0.3, seed=1)
        run_unpack(shapes, src, [dst] * len(shapes), 0.3, True, seed=2)
        run_unpack(shapes, src, [dst] * len(shapes), 0.3, False, seed=3)
        for n in (15, 16, 17, 48, 97):
            run_reduce(n, dst, src, 0.3, 1.7, seed=n)


@needs_interpreter
def test_block_edges_at_1024(monkeypatch):
    """GPU-sized block (1024) and chunk (2048): 1023 / 1025 / 100 003 straddle real edges."""
    monkeypatch.setattr(_triton, "INTERPRET_BLOCK", 1024)
    monkeypatch.setattr(_triton, "INTERPRET_CHUNK", 2048)
    shapes = [(n,) for n in (1023, 1024, 1025, 2047, 2049, 0, 3, BIG)]
    for src, dst in [(F32, F32), (F32, BF16), (BF16, F16)]:
        run_pack(shapes, [src] * len(shapes), dst, 0.3, seed=4)
        run_unpack(shapes, src, [dst] * len(shapes), 0.3, True, seed=6)
        for n in (1023, 1025, 2049):
            run_reduce(n, dst, src, 0.3, 1.7, seed=n)


@needs_interpreter
def test_tables_layout_and_alignment():
    ts = [torch.zeros(5), torch.zeros(0), torch.zeros(10000), torch.zeros(1, dtype=F16)]
    tab = _triton._Tables(ts, 4096, torch.device("cpu"))
    assert tab.numel.tolist() == [5, 10000, 1]  # the empty tensor gets no entry
    assert tab.flat_off.tolist() == [0, 5, 10005]
    assert tab.chunk_first.tolist() == [0, 1, 4]
    assert tab.chunk_owner.tolist() == [0, 1, 1, 1, 2]
    assert tab.n_chunks == 5 and tab.list_code == _common.MIXED_CODE
    assert not tab.aligned  # offset 5 is not a multiple of 8
    aligned = _triton._Tables([torch.zeros(8), torch.zeros(16)], 4096, torch.device("cpu"))
    assert aligned.aligned and aligned.list_code == 0


# ----------------------------------------------------------------------------
# empty inputs, dispatch, errors
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_empty_inputs(impl):
    if impl == "triton" and (_triton is None or not _triton.interpret_mode()):
        pytest.skip("Triton interpreter not active")
    out = sentinel((4,), F32)
    assert pack([], out, impl=impl) is out
    pack([torch.zeros(0), torch.zeros(2, 0)], out, scale=3.0, impl=impl)
    assert out.isnan().all()
    unpack(out, [], impl=impl)
    unpack(torch.zeros(0), [torch.zeros(0)], accumulate=True, impl=impl)
    pack([], torch.zeros(0), impl=impl)
    reduce_(torch.zeros(0), torch.zeros(0, dtype=BF16), impl=impl)


def test_auto_uses_torch_for_cpu_tensors(monkeypatch):
    if _triton is not None:

        def boom(*a, **k):
            raise AssertionError("auto must not launch Triton for CPU tensors")

        for name in ("pack", "unpack", "reduce_"):
            monkeypatch.setattr(_triton, name, boom)
    x = torch.ones(3)
    out = torch.empty(3, dtype=BF16)
    pack([x], out, scale=2.0)
    unpack(out, [x], accumulate=True, impl=Impl.AUTO)
    reduce_(x, out)
    assert x.tolist() == [5.0, 5.0, 5.0]


def test_impl_values():
    assert [i.value for i in Impl] == ["auto", "triton", "torch"]
    assert _common.parse_impl("TORCH") is Impl.TORCH
    assert _common.parse_impl(Impl.TRITON) is Impl.TRITON
    assert SUPPORTED_DTYPES == (F32, F16, BF16)


@pytest.mark.parametrize("bad", ["cuda", "", None, 1, Impl])
def test_bad_impl(bad):
    x = torch.ones(2)
    for call in (
        lambda: pack([x], torch.empty(2), impl=bad),
        lambda: unpack(torch.empty(2), [x], impl=bad),
        lambda: reduce_(x, x, impl=bad),
    ):
        with pytest.raises(ValueError, match="'auto', 'triton', 'torch'"):
            call()


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("bad_dtype", [torch.int32, torch.float64, torch.int8], ids=dname)
def test_unsupported_dtypes(impl, bad_dtype):
    good = torch.ones(4)
    bad = torch.ones(4, dtype=bad_dtype)
    match = "supported dtypes are float32, float16, bfloat16"
    with pytest.raises(ValueError, match=match):
        pack([good, bad], torch.empty(8), impl=impl)
    with pytest.raises(ValueError, match=match):
        pack([good], torch.empty(8, dtype=bad_dtype), impl=impl)
    with pytest.raises(ValueError, match=match):
        unpack(torch.empty(8, dtype=bad_dtype), [good], impl=impl)
    with pytest.raises(ValueError, match=match):
        unpack(torch.empty(8), [bad], impl=impl)
    with pytest.raises(ValueError, match=match):
        reduce_(bad, good, impl=impl)
    with pytest.raises(ValueError, match=match):
        reduce_(good, bad, impl=impl)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_flat_too_small(impl):
    ts = [torch.ones(3), torch.ones(2, 2)]
    with pytest.raises(ValueError, match=r"out holds 6 elements but the tensors need 7 \(1 more\)"):
        pack(ts, torch.empty(6), impl=impl)
    with pytest.raises(ValueError, match=r"flat holds 5 elements but the tensors need 7"):
        unpack(torch.empty(5), ts, impl=impl)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_non_contiguous_and_bad_shapes(impl):
    nc = torch.ones(4, 3).t()
    with pytest.raises(ValueError, match=r"tensors\[1\].*not contiguous"):
        pack([torch.ones(2), nc], torch.empty(20), impl=impl)
    with pytest.raises(ValueError, match=r"tensors\[0\].*not contiguous"):
        unpack(torch.empty(20), [nc], impl=impl)
    with pytest.raises(ValueError, match="1-D contiguous"):
        pack([torch.ones(2)], torch.empty(2, 2), impl=impl)
    with pytest.raises(ValueError, match="1-D contiguous"):
        unpack(torch.empty(20)[::2], [torch.ones(2)], impl=impl)
    with pytest.raises(ValueError, match="dst must be contiguous"):
        reduce_(nc, torch.ones(12), impl=impl)
    with pytest.raises(ValueError, match="dst has 3 elements but src has 4"):
        reduce_(torch.ones(3), torch.ones(4), impl=impl)
    with pytest.raises(ValueError, match="list or tuple"):
        pack(torch.ones(3), torch.empty(3), impl=impl)
    with pytest.raises(ValueError, match=r"tensors\[0\] must be a torch.Tensor"):
        pack([[1.0, 2.0]], torch.empty(3), impl=impl)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_device_mismatch(impl):
    meta = torch.empty(3, device="meta")
    with pytest.raises(ValueError, match=r"tensors\[0\] is on meta but the flat buffer is on cpu"):
        pack([meta], torch.empty(3), impl=impl)
    with pytest.raises(ValueError, match="is on cpu but the flat buffer is on meta"):
        unpack(meta, [torch.ones(3)], impl=impl)
    with pytest.raises(ValueError, match="dst is on cpu but src is on meta"):
        reduce_(torch.ones(3), meta, impl=impl)


@needs_interpreter
def test_triton_refuses_devices_it_cannot_serve():
    # interpret mode: the kernels dereference host addresses, so non-CPU tensors are refused
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        pack([torch.empty(3, device="meta")], torch.empty(3, device="meta"), impl="triton")


def test_torch_plan_covers_every_tensor_once():
    small, chunk = _torch.SMALL, _torch.SMALL * 2
    sizes = (5, 0, 3 * small + 7, 1, 2, small - 1, small - 1, small - 1, 0, small, 4)
    plan = _torch._Plan(sizes, chunk, small)
    offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    assert plan.offsets == offsets[:-1]
    assert plan.big == [2, 9]
    assert plan.batches == [[0], [3, 4, 5], [6, 7], [10]]
    for idx, (lo, hi) in zip(plan.batches, plan.spans):
        assert lo == offsets[idx[0]] and hi == offsets[idx[-1] + 1] and hi - lo <= chunk
        assert all(sizes[i] < small for i in idx)
    seen = sorted(plan.big + [i for b in plan.batches for i in b])
    assert seen == [i for i, n in enumerate(sizes) if n]


@needs_interpreter
def test_torch_path_with_tiny_batches_and_pieces(monkeypatch):
    """Shrink the torch path's CHUNK / SMALL so every branch runs on small inputs:
    big tensors in several pieces, batches split, batches with and without gaps."""
    monkeypatch.setattr(_torch, "CHUNK", 64)
    monkeypatch.setattr(_torch, "SMALL", 16)
    shapes = [(n,) for n in (3, 40, 0, 17, 130, 5, 64, 16, 15, 1, 200, 2, 2)]
    for src, dst in PAIRS:
        run_pack(shapes, [src] * len(shapes), dst, 0.3, seed=21)
        for acc in (False, True):
            run_unpack(shapes, src, [dst] * len(shapes), 0.3, acc, seed=22)
        run_reduce(150, dst, src, 0.3, 1.7, seed=23)
    mixed = [F32, BF16, F16] * 4 + [F32]
    run_pack(shapes, mixed, BF16, 0.3, seed=24)
    run_unpack(shapes, F16, mixed, 0.3, True, seed=25)


def test_torch_slots_cache_follows_the_buffer():
    buf = torch.zeros(10)
    ts = [torch.ones(2, 3), torch.ones(4)]
    a = _torch._slots(buf, 0, ts)
    assert [v.shape for v in a] == [(2, 3), (4,)] and a[1].data_ptr() == buf.data_ptr() + 6 * 4
    assert _torch._slots(buf, 0, ts) is a  # cached
    other = torch.zeros(10)
    b = _torch._slots(other, 0, ts)
    assert b is not a and b[0].data_ptr() == other.data_ptr()
    n = len(_torch._SLOTS)
    del buf, a
    import gc

    gc.collect()
    assert len(_torch._SLOTS) == n - 1  # the entry died with its buffer


def test_docstring_examples():
    import doctest
    import importlib
    import sys

    for name in ("commrt.kernels", "commrt.kernels.pack", "commrt.kernels.reduce"):
        importlib.import_module(name)
        result = doctest.testmod(
            sys.modules[name]
        )  # sys.modules: commrt.kernels.pack is also a function name
        assert result.failed == 0 and result.attempted > 0, (name, result)


def test_a_launch_records_its_table_once_per_stream_and_holds_only_on_a_side_stream(monkeypatch):
    """The CUDA stream bookkeeping of a list launch, with stand-in streams: the table is
    recorded on each stream it is used from, once; the side stream comes back (its
    launches hold their tensors), the default stream does not."""
    if _triton is None:
        pytest.skip("triton is not installed")

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    class Owner:
        recorded: list = []

        def record_stream(self, stream):
            self.recorded.append(stream.cuda_stream)

    default, side = Stream(0), Stream(7)
    current = [default]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: current[0])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device: default)
    monkeypatch.setattr(lifetime, "_DEFAULT_STREAM", {})
    tab = types.SimpleNamespace(streams=set(), chunk_owner=Owner())
    dev = torch.device("cuda", 0)
    assert _triton._side_stream(tab, dev) is None
    current[0] = side
    assert _triton._side_stream(tab, dev) is side
    assert _triton._side_stream(tab, dev) is side
    current[0] = default
    assert _triton._side_stream(tab, dev) is None
    assert Owner.recorded == [0, 7]
    assert _triton._side_stream(tab, torch.device("cpu")) is None
