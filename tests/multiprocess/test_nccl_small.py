"""Smaller rules around NCCL, checked without a GPU.

What these check: commrt's own logic around NCCL (the import check, backend
choice, the unique-id generations, the device choice, argument checks before
a group opens, closing syncs, the progress thread's device). They use fake
cupy modules, torch's real stores, and the MPI stand-in (tests/helpers/nccl_standin.py);
none of it says anything about NCCL, CUDA or a GPU.

Run as a script under ``mpiexec -n 2`` it is the worker of
:func:`test_bad_tensor_leaves_no_partial_group`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types

import pytest
import torch

import commrt
from commrt.runtime.choice import Backend, Situation, choose
from commrt.sync.progress import ProgressThread
from commrt.sync.step_state import StepState
from commrt.transports.nccl import import_nccl
from commrt.transports.nccl_bootstrap import exchange_unique_id, nccl_device


def _fake_cupy(monkeypatch, available: bool):
    """cupy.cuda.nccl as cupy leaves it: importable, ``available`` False without libnccl."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = available
    if available:
        nccl.get_unique_id = lambda: bytes(128)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl = nccl
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.nccl", nccl)):
        monkeypatch.setitem(sys.modules, name, mod)
    return nccl


def _no_cupy(monkeypatch):
    for name in ("cupy", "cupy.cuda", "cupy.cuda.nccl"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


# -- item 1: import_nccl() fails when cupy could not load libnccl


def test_import_nccl_says_what_to_install_when_libnccl_is_missing(monkeypatch):
    _fake_cupy(monkeypatch, available=False)
    with pytest.raises(RuntimeError, match=r"(?s)could not load libnccl.*cuda12.*cuda13"):
        import_nccl()
    with pytest.raises(RuntimeError, match="could not load libnccl"):
        commrt.init("nccl", rank=0, world_size=1)


def test_import_nccl_without_cupy_and_with_a_working_one(monkeypatch):
    _no_cupy(monkeypatch)
    with pytest.raises(RuntimeError, match=r"(?s)needs CuPy with NCCL.*commrt\[cuda12\]"):
        import_nccl()
    nccl = _fake_cupy(monkeypatch, available=True)
    assert import_nccl().module is nccl


# -- item 2: backend="auto" on a CUDA machine without cupy/NCCL


def test_auto_on_cuda_without_cupy_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _no_cupy(monkeypatch)
    with pytest.warns(
        UserWarning, match=r"(?s)falls back to the CPU transports:\n.*cuda12.*cuda13"
    ):
        with commrt.init() as comm:
            assert comm.backend is commrt.Backend.GLOO
    lacking = Situation.here("cuda", "mpiexec", 2, 2, mpi_world=True)
    assert "cuda12" in lacking.nccl_missing and choose(lacking)[0] is commrt.Backend.SHM
    assert choose(dataclasses.replace(lacking, shm_unusable="no /dev/shm"))[0] is Backend.MPI
    _fake_cupy(monkeypatch, available=False)
    with pytest.warns(UserWarning, match="libnccl"):
        with commrt.init() as comm:
            assert comm.backend is commrt.Backend.GLOO
    _fake_cupy(monkeypatch, available=True)
    assert choose(Situation.here("cuda", "none", 1, 1, mpi_world=False))[0] is Backend.NCCL


# -- item 3: the unique id of one init is never read by another


def _store(kind: str):
    import torch.distributed as dist

    td = datetime.timedelta(seconds=20)
    if kind == "hash":
        base = dist.HashStore()
        base.set_timeout(td)
        return base, base
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=td, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=td)
    return server, client


def _rank_thread(store, rank: int, uid, got: dict):
    def run():
        got[rank] = exchange_unique_id(store, rank, uid)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("kind", ["hash", "tcp"])
def test_a_second_init_never_reads_the_first_id(kind):
    import torch.distributed as dist

    s0, s1 = (dist.PrefixStore("commrt", s) for s in _store(kind))
    first, second = b"\1" * 128, b"\2" * 128
    got: dict = {}
    for t in (_rank_thread(s1, 1, None, got), _rank_thread(s0, 0, first, got)):
        t.join(20)
    assert got == {0: first, 1: first}
    # second init: rank 1 races ahead of rank 0, whose first id is still in the store
    got = {}
    late = _rank_thread(s1, 1, None, got)
    late.join(0.5)
    assert late.is_alive() and got == {}, "rank 1 took the first init's id"
    _rank_thread(s0, 0, second, got).join(20)
    late.join(20)
    assert got == {0: second, 1: second}


def test_a_restarted_torchrun_attempt_never_reads_a_dead_attempts_id(monkeypatch):
    """The agent store survives an elastic restart; a rank may have died before its init."""
    import torch.distributed as dist

    store = dist.PrefixStore("commrt", _store("hash")[0])
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert exchange_unique_id(store, 0, b"\1" * 128) == b"\1" * 128  # rank 1 never came
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    got: dict = {}
    late = _rank_thread(store, 1, None, got)
    late.join(0.5)
    assert late.is_alive() and got == {}, "the restarted rank 1 took the dead attempt's id"
    _rank_thread(store, 0, b"\3" * 128, got).join(20)
    late.join(20)
    assert got == {0: b"\3" * 128, 1: b"\3" * 128}


def test_rank_0_keeps_the_store_it_hosts_until_the_communicator_exists(monkeypatch):
    """A store rank 0 hosts lives until the (collective) communicator creation returns.

    Rank 1 reads the id late, as a slower process does. When rank 0 dropped its store
    right after publishing, rank 1's read failed and rank 1 exited, while rank 0 waited
    in the collective creation forever (CI hung in test_allreduce_mp this way)."""
    import torch.distributed as dist

    from commrt.transports import nccl_bootstrap

    both_in = threading.Barrier(2, timeout=20)

    class CollectiveTransport:  # creating a communicator waits for every rank, as NCCL's does
        def __init__(self, rank, world_size, uid, device, nccl, timeout=None):
            self.uid = uid
            both_in.wait()

    monkeypatch.setattr(nccl_bootstrap, "NcclTransport", CollectiveTransport)
    fake = types.SimpleNamespace(get_unique_id=lambda: b"\7" * 128)
    td = datetime.timedelta(seconds=5)
    port: list[int] = []
    got: dict = {}

    def host():
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=td, wait_for_workers=False)
        port.append(store.port)
        return store

    def late_client():
        time.sleep(0.5)  # rank 0 has published and returned from the exchange by now
        return dist.TCPStore("127.0.0.1", port[0], 2, False, timeout=td)

    def rank(r, make_store):
        try:
            got[r] = nccl_bootstrap.init_nccl(
                r, 2, r, "cpu", fake, make_store=make_store, timeout=30
            ).uid
        except Exception as e:  # noqa: BLE001 - the test reports what each rank saw
            got[r] = e

    threads = [
        threading.Thread(target=rank, args=(0, host), daemon=True),
        threading.Thread(target=rank, args=(1, late_client), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {0: b"\7" * 128, 1: b"\7" * 128}, got


# -- item 4: device="cuda" without an index


def test_nccl_device_gives_cuda_without_an_index_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert nccl_device("cuda", 5) == torch.device("cuda", 1)
    assert nccl_device(torch.device("cuda"), 2) == torch.device("cuda", 2)
    assert nccl_device(None, 6) == torch.device("cuda", 2)
    assert nccl_device("cuda:3", 0) == torch.device("cuda", 3)
    assert nccl_device("cpu", 1) == torch.device("cpu")  # the stand-in's tests run on CPU
    assert nccl_device("cuda", 3, device_count=lambda: 2) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        nccl_device("cuda", 0)


# -- item 5: a bad tensor raises before groupStart() (two ranks over the stand-in)


@pytest.mark.mpi
def test_bad_tensor_leaves_no_partial_group(tmp_path):
    exe = shutil.which("mpiexec")
    assert exe, "mpiexec not found: install the dev extras"
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [exe, "-n", "2", sys.executable, os.path.abspath(__file__), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank, r in enumerate(json.loads(out.read_text())):
        assert "NCCL cannot move torch.complex64" in r["dtype"], r
        assert "contiguous" in r["strided"], r
        # nothing reached the stand-in, no group left open
        assert r["dtype_calls"] == r["strided_calls"] == 0, r
        assert r["dtype_depth"] == r["strided_depth"] == 0, r
        # the next valid exchange gets this exchange's data, not a stray earlier send
        assert r["after"] == [float(10 * (1 - rank) + 3)] * 4, r


def _bad_tensor_worker(out_path: str) -> None:
    from mpi4py import MPI

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers.nccl_standin import StandInNccl

    from commrt.transports.nccl import NcclTransport

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    peer = 1 - rank
    nccl = StandInNccl()
    uid = world.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    t = NcclTransport(rank, 2, uid, torch.device("cpu"), nccl=nccl, timeout=30)
    report = {}
    bad = {"dtype": torch.zeros(4, dtype=torch.complex64), "strided": torch.zeros(8)[::2]}
    for phase, (name, tensor) in enumerate(bad.items(), 1):
        good = torch.full((4,), float(10 * rank + phase))
        try:
            t.exchange([(good, peer)], [(tensor, peer)], 0)
            report[name] = "no error"
        except ValueError as e:
            report[name] = str(e)
        report[f"{name}_calls"], report[f"{name}_depth"] = len(nccl.calls), nccl.depth
    world.Barrier()
    got = torch.zeros(4)
    sent = torch.full((4,), float(10 * rank + 3))
    pend = t.exchange([(sent, peer)], [(got, peer)], 0)
    deadline = time.monotonic() + 60  # the stand-in completes on its stream, as NCCL does
    report["after"] = got.tolist() if pend.wait_recv(0, deadline) else "never arrived"
    pend.wait_send(0, deadline)
    reports = world.gather(report, root=0)
    t.close()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(reports, f)


# -- item 6: Communicator.close() stops open GradientSyncs


def _progress_threads() -> set:
    return {t for t in threading.enumerate() if t.name.startswith("commrt-progress")}


def test_close_stops_open_gradient_syncs():
    before = _progress_threads()
    comm = commrt.init("gloo")
    model = torch.nn.Linear(4, 2)
    sync = commrt.GradientSync(model, comm)
    model(torch.ones(3, 4)).sum().backward()
    sync.step(torch.optim.SGD(model.parameters(), lr=0.1))
    (thread,) = _progress_threads() - before
    assert thread.is_alive() and comm.syncs.open() == (sync,)
    comm.close()
    assert not thread.is_alive()
    assert comm.syncs.open() == () and comm.closed
    sync.close()  # still idempotent


# -- item 7: the progress thread sets its device (a fake CUDA device: checks the call only)


def _idle_progress(device: torch.device, name: str) -> ProgressThread:
    comm = types.SimpleNamespace(device=device)
    runner = types.SimpleNamespace(cuda=device.type == "cuda", comm=comm, tracer=None)
    return ProgressThread(StepState.fresh([], 0), runner, policy=None, name=name)


def test_progress_thread_sets_its_cuda_device_first(monkeypatch):
    """Checks that the thread itself calls torch.cuda.set_device(comm.device) before
    anything else, and not on CPU; not that CUDA honours it (tests/gpu/test_gpu.py does)."""
    calls = []
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: calls.append((d, threading.current_thread().name))
    )
    for device, name in ((torch.device("cuda", 3), "p-cuda"), (torch.device("cpu"), "p-cpu")):
        progress = _idle_progress(device, name)
        progress.start()
        deadline = time.monotonic() + 10
        while device.type == "cuda" and not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert progress.stop(10)
    assert calls == [(torch.device("cuda", 3), "p-cuda")]


def test_progress_thread_hands_a_set_device_error_to_wait(monkeypatch):
    def fail(d):
        raise RuntimeError("invalid device ordinal")

    monkeypatch.setattr(torch.cuda, "set_device", fail)
    progress = _idle_progress(torch.device("cuda", 7), "p-fail")
    progress.start()
    deadline = time.monotonic() + 10
    while progress.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with progress.cv, pytest.raises(commrt.CommError, match="invalid device ordinal"):
        progress.raise_error()
    progress.stop(10)


if __name__ == "__main__":
    _bad_tensor_worker(sys.argv[1])


def test_the_nccl_refusal_a_user_sees_is_one_error_in_80_columns():
    """``commrt.init(backend="nccl")`` where CuPy is missing, as a script run by a user
    sees it: one error (no chained ImportError trace above it), every line of its message
    within 80 columns, suggesting on a CPU what cuda_ipc's refusal suggests."""
    from commrt.transports.base import ON_A_CPU
    from commrt.transports.cuda_ipc_connect import cuda_missing

    script = "import sys; sys.modules['cupy'] = None\nimport commrt\ncommrt.init(backend='nccl')"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    err = proc.stderr
    assert proc.returncode == 1 and err.count("Traceback") == 1, err
    assert "direct cause" not in err and "During handling" not in err, err
    message = err[err.index("RuntimeError: ") :].splitlines()
    assert all(len(line) <= 80 for line in message), message
    assert ON_A_CPU in " ".join(message) and "commrt[cuda12]" in err, err
    if not torch.cuda.is_available():
        assert ON_A_CPU in cuda_missing()
