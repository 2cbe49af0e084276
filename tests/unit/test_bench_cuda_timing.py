"""bench/cuda_timing.py, the GPU timing of the kernel and hot-path benchmarks, on the CPU:
the sizes (buffer sets past the L2 cache, calls a round, the sleep in front) as plain
arithmetic, and the order of the timing calls against a logged stand-in for torch.cuda.
Nothing here runs on a GPU."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench")


@pytest.fixture
def T(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    return importlib.import_module("cuda_timing")


MB = 1 << 20


def test_buffer_sets_hold_four_times_the_l2_cache_within_the_free_memory(T):
    l2, free = 50 * MB, 70 << 30  # an H100's L2, most of its memory free
    assert T.buffer_sets(l2, 8 * MB, free) == 25  # 25 x 8 MB = 200 MB = 4 x L2
    assert T.buffer_sets(l2, 7 * MB, free) == 29  # rounded up: 29 x 7 MB >= 200 MB
    assert T.buffer_sets(l2, 128 * MB, free) == 2
    assert T.buffer_sets(l2, 2048 * MB, free) == 1  # one set past the cache is cold
    # little free memory caps the sets, at least one
    assert T.buffer_sets(l2, 8 * MB, 100 * MB) == 5  # 0.4 x 100 MB holds 5
    assert T.buffer_sets(l2, 8 * MB, MB) == 1
    for sets, size in [(25, 8 * MB), (29, 7 * MB), (2, 128 * MB)]:
        assert sets * size >= T.L2_TIMES * l2 > (sets - 1) * size
    with pytest.raises(ValueError, match="must hold something"):
        T.buffer_sets(l2, 0, free)


def test_a_round_passes_over_every_set_alike_and_moves_about_4_gb(T):
    assert T.calls_per_round(1, 1 << 30) == 3  # 4e9 // 1 GiB
    assert T.calls_per_round(1, 8 << 30) == 1
    assert T.calls_per_round(25, 8 * MB) == 250  # 256 wanted, whole passes over 25 sets
    assert T.calls_per_round(200, MB) == 200  # every set once, even past MAX_CALLS
    for sets, size in [(3, 5 * MB), (7, MB), (1, 100)]:
        calls = T.calls_per_round(sets, size)
        assert calls % sets == 0 and calls >= sets


def test_the_sleep_outlasts_the_hosts_calls_and_gbps_is_bytes_over_time(T):
    assert T.sleep_cycles(0.01, 1.5e9) == int(T.SLEEP_MARGIN * 0.01 * 1.5e9)
    assert T.sleep_cycles(0.0, 1.5e9) == 1000
    with pytest.raises(ValueError):
        T.sleep_cycles(0.01, 0)
    assert T.gbps(8e9, 2.0) == 4.0
    with pytest.raises(ValueError, match="positive"):
        T.gbps(8e9, 0.0)


class FakeCuda:
    """torch.cuda's sleep and events, logged; the GPU catches up in the first
    ``caught_up`` rounds (the start event has completed when the host looks)."""

    def __init__(self, monkeypatch, T, caught_up=0, gpu_ms=2.0):
        import torch

        self.log, self.sleeps, self.caught = [], [], caught_up
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing

            def record(self):
                fake.log.append("record")

            def query(self):
                fake.log.append("query")
                fake.caught -= 1
                return fake.caught >= 0

            def synchronize(self):
                fake.log.append("wait")

            def elapsed_time(self, other):
                return gpu_ms

        def sleep(cycles):
            fake.log.append("sleep")
            fake.sleeps.append(cycles)

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", sleep)
        monkeypatch.setattr(T, "cycles_per_second", lambda: 1e9)

    def call(self, name="call"):
        return lambda: self.log.append(name)


def test_a_round_is_queued_behind_a_sleep_and_the_host_is_timed_around_the_calls(monkeypatch, T):
    cuda = FakeCuda(monkeypatch, T)
    gpu, host, caught_up = T.busy_round([cuda.call("a"), cuda.call("b")], 4, 10**6)
    # the sleep first; the calls rotate through the sets between the two events; the host
    # looks whether the GPU reached the start before it records the end
    assert cuda.log == ["sleep", "record", "a", "b", "a", "b", "query", "record", "wait"]
    assert gpu == 2.0 / 1e3 / 4 and 0 < host < 0.01 and caught_up is False


def test_a_round_the_gpu_caught_up_with_runs_again_behind_a_longer_sleep(monkeypatch, T):
    cuda = FakeCuda(monkeypatch, T, caught_up=2)
    gpu, host_bound = T.gpu_seconds([cuda.call()], 10, host_s=1e-4)
    assert host_bound is False and gpu == 2.0 / 1e3 / 10
    first = T.sleep_cycles(1e-4 * 10, 1e9)
    assert cuda.sleeps == [first, first * T.SLEEP_GROWTH, first * T.SLEEP_GROWTH**2]
    # caught up every time: the figure is the host's pace, and says so
    cuda = FakeCuda(monkeypatch, T, caught_up=99)
    assert T.gpu_seconds([cuda.call()], 10, host_s=1e-4)[1] is True
    assert len(cuda.sleeps) == T.SLEEP_TRIES


def test_host_time_is_measured_with_the_gpu_kept_busy(monkeypatch, T):
    cuda = FakeCuda(monkeypatch, T, caught_up=1)
    per_call = T.host_seconds(cuda.call(), calls=5)
    assert 0 < per_call < 0.01
    # the first sleep from the guess; caught up, so again from what was measured
    assert cuda.sleeps[0] == T.sleep_cycles(T.HOST_GUESS_S * 5, 1e9) and len(cuda.sleeps) == 2
    assert cuda.log.count("call") == 10 and "sleep" == cuda.log[0]


def test_the_kernel_benchmarks_host_table_fits_80_columns(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    sys.modules.pop("bench_kernels", None)
    K = importlib.import_module("bench_kernels")
    host = {("small", mb, "pack"): 700.0 + mb for mb in K.CUDA_SIZES_MB}
    host[("small", 4, "copy")] = 5.0
    rows = K.host_rows(host, "small")
    assert rows[0] == ["op"] + [f"{mb} MB" for mb in K.CUDA_SIZES_MB]
    assert rows[1] == ["pack"] + [f"{700.0 + mb:.1f}" for mb in K.CUDA_SIZES_MB]
    assert rows[2] == ["copy", "-", "5.0", "-", "-", "-", "-"]
    assert all(len(K.summary_line(r)) <= 80 for r in rows)
    assert K.host_rows(host, "resnet50") == [["op"]]
