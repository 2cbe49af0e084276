"""Cross-process waits per all-reduce on the ``cuda_ipc`` transport, counted on the strict
CPU stand-in device (tests/workers/ipc_count_worker.py, :func:`commrt.testing.counted`).

A one-shot all-reduce of at most ``COMMRT_CUDA_IPC_HOST_BYTES`` (1 MiB) is summed on the
host (commrt.transports.cuda_ipc_host): one wait per peer, two launches (the copy out
and the copy back), two host waits for the stream (its copy out; at the end, as CPU
tensors return with the result). Summed on the device (commrt.transports.cuda_ipc_direct,
the variable at 0, or a larger call): one wait per peer per round of the workspace's half
(16 MiB), three launches per round (copy in, post, sum), one host wait at the end. Every
rank gets the same bits, within rounding of a float64 sum, on either path. The same
schedule run step by step through the slots waits four times per peer per call. None of
this is a GPU result."""

import json

import pytest
from helpers.mp import gloo_ranks

SMALL = "8,4096,1048576"
DTYPES = ("float32", "bfloat16")


#: where the one-shot sums: (COMMRT_CUDA_IPC_HOST_BYTES, launches, host waits per call)
PATHS = {"host": ("1048576", 2, 2), "device": ("0", 3, 1)}


def _run(tmp_path, p, algorithms, sizes, host_bytes="1048576"):
    codes, outs = gloo_ranks(p, "ipc_count_worker.py", tmp_path, algorithms, sizes, timeout=400,
                             env={"COMMRT_CUDA_IPC_HOST_BYTES": host_bytes})  # fmt: skip
    assert codes == [0] * p, "\n---\n".join(outs)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(p)]
    for report in reports:
        assert report.pop("ran on") == "cuda_ipc cpu", report  # the stand-in: never a GPU
    return reports


def _same_bits_and_close(reports, key):
    assert len({r[key]["sha"] for r in reports}) == 1, [r[key] for r in reports]
    tol = 1e-6 if "float32" in key else 2**-7
    assert all(r[key]["err"] < tol for r in reports), [r[key]["err"] for r in reports]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("p", [2, pytest.param(3, marks=pytest.mark.slow),
                               pytest.param(4, marks=pytest.mark.slow)])  # fmt: skip
def test_one_shot_waits_once_per_peer_and_every_rank_gets_the_same_bits(tmp_path, p, path):
    host_bytes, launches, stream_waits = PATHS[path]
    reports = _run(tmp_path, p, "one_shot", SMALL, host_bytes)
    for nbytes in map(int, SMALL.split(",")):
        for dtype in DTYPES:
            key = f"one_shot {nbytes} {dtype}"
            _same_bits_and_close(reports, key)
            for report in reports:
                assert report[key]["waits"] == [1] * (p - 1), (key, report[key])
                assert report[key]["launches"] == launches, (key, report[key])
                assert report[key]["stream_waits"] == stream_waits, (key, report[key])


@pytest.mark.slow
@pytest.mark.parametrize("p", [2, 3, 4])
def test_a_32_mib_one_shot_waits_once_per_peer_per_workspace_round(tmp_path, p):
    reports = _run(tmp_path, p, "one_shot", str(32 << 20))
    for dtype in DTYPES:
        key = f"one_shot {32 << 20} {dtype}"
        _same_bits_and_close(reports, key)
        for report in reports:  # two rounds of the 16 MiB half
            assert report[key]["waits"] == [2] * (p - 1), (key, report[key])


@pytest.mark.slow
def test_step_by_step_the_same_call_waits_on_every_piece(tmp_path):
    """The slot protocol, for contrast (and so that the count is seen to count): a
    two-shot at 2 ranks waits on its peer 8 times per call (2 steps, each a piece each
    way: a counter and an event per piece), and its bits still agree."""
    reports = _run(tmp_path, 2, "two_shot", "4096")
    for dtype in DTYPES:
        key = f"two_shot 4096 {dtype}"
        _same_bits_and_close(reports, key)
        assert all(r[key]["waits"] == [8] for r in reports), [r[key] for r in reports]


@pytest.mark.parametrize("p", [2, pytest.param(3, marks=pytest.mark.slow),
                               pytest.param(4, marks=pytest.mark.slow)])  # fmt: skip
def test_auto_models_the_one_shot_first_and_its_calls_wait_once_per_peer(tmp_path, p):
    """``auto``'s model weighs the one-shot where the transport runs it whole: without
    learning (``model``) it runs it at 8 B, 4 KiB and 1 MiB, and its steady-state call waits
    once per peer. With learning, the trial's timings may keep another candidate (on a busy
    machine recursive doubling measured as fast at 8 B): every rank keeps the same one and
    gets the same bits, and a kept one-shot still waits once per peer."""
    reports = _run(tmp_path, p, "model,auto", SMALL)
    for nbytes in map(int, SMALL.split(",")):
        for dtype in DTYPES:
            key = f"model {nbytes} {dtype}"
            _same_bits_and_close(reports, key)
            for report in reports:
                assert report[key]["runs"] == "auto:one_shot", (key, report[key])
                assert report[key]["waits"] == [1] * (p - 1), (key, report[key])
            key = f"auto {nbytes} {dtype}"
            _same_bits_and_close(reports, key)
            assert len({r[key]["runs"] for r in reports}) == 1, [r[key] for r in reports]
            for report in reports:
                if report[key]["runs"] == "auto:one_shot":
                    assert report[key]["waits"] == [1] * (p - 1), (key, report[key])
