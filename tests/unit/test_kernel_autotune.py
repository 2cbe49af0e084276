"""Autotuning applies a kernel once, and in-place calls are allowed in one form only.

On a GPU the first launch of each size and dtype goes through Triton's
autotuner, which runs every config several times on the caller's tensors
before the chosen one runs for real. A kernel that reads what it writes
would apply itself once per trial: ``pack([flat], flat, scale=0.5)`` with
2 configs timed by 7 launches each came back scaled by ``0.5**15``.

Here the tuned launch path runs under Triton's interpreter on CPU tensors:
:func:`commrt.kernels._triton.autotunes` is switched on, every tuned kernel
gets two configs, and its timing is replaced by "launch the kernel
``TRIALS`` times". Each result must equal one application of the kernel.
Without the restores in :mod:`commrt.kernels._triton_kernels` (pack's
``restore_value=["out"]``, unpack's hooks on every destination, reduce_'s
``restore_value=["dst"]``) the in-place cases below fail.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import triton
from triton.runtime.autotuner import Autotuner

from commrt.kernels import _triton as K
from commrt.kernels import _triton_kernels as TK
from commrt.kernels import pack, reduce_, unpack

TUNED = [TK._pack_kernel_tuned, TK._unpack_kernel_tuned, TK._reduce_kernel_tuned]
TRIALS = 7  # launches per config in the replaced timing: (2 * 7 + 1) applications unrestored


@pytest.fixture
def tuning(monkeypatch):
    """The autotuned launch path in the interpreter; returns the list of timed configs."""
    monkeypatch.setattr(K, "autotunes", lambda: True)
    monkeypatch.setattr(K, "_BEST", {})
    timed = []

    def bench(kernel_call, quantiles):
        for _ in range(TRIALS):
            kernel_call()
        timed.append(len(timed))
        return [float(len(timed))] * len(quantiles)  # the first config wins

    configs = [triton.Config({"BLOCK": 1024}, num_warps=4), triton.Config({"BLOCK": 2048})]
    for tuned in TUNED:
        monkeypatch.setattr(tuned, "configs", configs)
        monkeypatch.setattr(tuned, "cache", {})
        monkeypatch.setitem(tuned.__dict__, "do_bench", bench)  # the cached_property's slot
    return timed


def _rand(n, dtype=torch.float32, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_every_tuned_kernel_is_covered():
    """A new tuned kernel must join TUNED (and the tests below)."""
    found = {id(v) for v in vars(TK).values() if isinstance(v, Autotuner)}
    assert found == {id(t) for t in TUNED}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_pack_in_place_is_scaled_once(tuning, dtype):
    """distributed/ops.py averages with ``pack([flat], flat, scale=1/p)``."""
    x = _rand(5000, dtype)
    flat = x.clone()
    pack([flat], flat, scale=0.5, impl="triton")
    assert tuning == [0, 1]  # the autotuner ran: 2 configs timed
    assert torch.equal(flat, (x.float() * 0.5).to(dtype))


def test_pack_of_a_buckets_own_views_in_place(tuning):
    """Each tensor IS its slot (GradientSync's gradient views): one pass, scaled once."""
    x = _rand(10_000)
    flat = x.clone()
    pack(list(flat.split([3000, 7000])), flat, scale=0.25, impl="triton")
    assert tuning and torch.equal(flat, x * 0.25)


def test_pack_apart_from_out_is_unchanged_by_tuning(tuning):
    grads = [_rand(3000, seed=1), _rand(1234, torch.bfloat16, seed=2)]
    out = torch.full((4300,), float("nan"))
    pack(grads, out, scale=0.5, impl="triton")
    want = torch.cat([g.float() for g in grads]) * 0.5
    assert tuning and torch.equal(out[:4234], want) and out[4234:].isnan().all()


@pytest.mark.parametrize("accumulate", [False, True], ids=["copy", "accumulate"])
def test_unpack_in_place_is_applied_once(tuning, accumulate):
    x = _rand(6000)
    flat = x.clone()
    unpack(flat, list(flat.split([1000, 5000])), scale=0.5, accumulate=accumulate, impl="triton")
    assert tuning and torch.equal(flat, x + x * 0.5 if accumulate else x * 0.5)


def test_unpack_accumulates_once_into_separate_gradients(tuning):
    flat, g0 = _rand(4000, torch.bfloat16), _rand(4000, seed=3)
    g = g0.clone()
    unpack(flat, [g], scale=0.5, accumulate=True, impl="triton")
    assert tuning and torch.equal(g, g0 + flat.float() * 0.5)


def test_reduce_on_itself_and_apart_is_applied_once(tuning):
    d0, s = _rand(9000), _rand(9000, torch.bfloat16, seed=4)
    d = d0.clone()
    reduce_(d, s, impl="triton")
    assert torch.equal(d, d0 + s.float())
    d = d0.clone()
    reduce_(d, d, alpha=0.5, beta=0.25, impl="triton")
    assert torch.equal(d, d0 * 0.5 + d0 * 0.25)
    assert len(tuning) == 4  # two keys (src dtypes), two configs each


def test_launches_after_tuning_use_the_chosen_config(tuning):
    """The second call of a key skips the autotuner (and so its trials)."""
    flat = _rand(5000)
    pack([flat], flat, scale=0.5, impl="triton")
    pack([flat], flat, scale=0.5, impl="triton")
    assert tuning == [0, 1] and torch.equal(flat, _rand(5000) * 0.25)


# ------------------------------------------------------------ overlaps that are refused


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_a_tensor_overlapping_the_flat_buffer_elsewhere_is_refused(impl):
    flat = _rand(100)
    with pytest.raises(ValueError, match=r"tensors\[0\] overlaps out.*own slot out\[0:50\]"):
        pack([flat[10:60]], flat, impl=impl)
    with pytest.raises(ValueError, match=r"tensors\[1\] overlaps flat.*own slot flat\[20:40\]"):
        unpack(flat, [torch.zeros(20), flat[:20]], impl=impl)
    with pytest.raises(ValueError, match="overlaps out"):  # its own address, another dtype
        pack([flat[:50]], flat.view(torch.bfloat16), impl=impl)
    assert torch.equal(flat, _rand(100))  # refused before anything was written


def test_the_overlap_check_runs_once_per_list_and_buffer_and_refuses_every_time(monkeypatch):
    """GradientSync packs a bucket's own views into its buffer every step: the tensor-by-tensor
    check runs on the first call only, for that buffer; a refused list is refused again."""
    calls = []
    check = K.check_overlap
    monkeypatch.setattr(K, "check_overlap", lambda *a: (calls.append(a[2]), check(*a)))
    # tables cached by earlier tests may have these very addresses, checked already
    monkeypatch.setattr(K, "_TABLE_CACHE", OrderedDict())
    flat = _rand(10_000)
    views = list(flat.split([3000, 7000]))
    for _ in range(3):
        pack(views, flat, scale=1.0, impl="triton")
    assert calls == ["out"]
    other = torch.zeros(20_000)
    unpack(other[5000:15000], list(other.split([5000, 3000, 12000]))[1:2], impl="triton")
    assert calls == ["out", "flat"]  # another buffer inside the list's bytes: checked
    for _ in range(2):
        with pytest.raises(ValueError, match="overlaps out"):
            pack([flat[10:60]], flat, impl="triton")
    assert calls == ["out", "flat", "out", "out"]


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_reduce_refuses_a_src_overlapping_dst_in_part(impl):
    d = _rand(100)
    with pytest.raises(ValueError, match="src overlaps dst in part"):
        reduce_(d[10:], d[:-10], impl=impl)
    with pytest.raises(ValueError, match="src overlaps dst in part"):
        reduce_(d[:50], d.view(torch.bfloat16)[:50], impl=impl)
    reduce_(d[:50], d[50:], impl=impl)  # apart: fine
    reduce_(d, d, impl=impl)  # itself: fine


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_in_place_without_tuning_matches_the_reference(impl):
    x = _rand(3000)
    flat = x.clone()
    pack(list(flat.split([1000, 2000])), flat, scale=0.5, impl=impl)
    assert torch.equal(flat, x * 0.5)
