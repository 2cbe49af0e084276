"""NCCL calls that block in C code, bounded; and the dtypes and ids cupy takes.

Ranks are threads of this process, each with its own strict stand-in
(tests/helpers/nccl_strict.py) over one in-memory store, in the modes that
block as NCCL does: an ``abort()`` that hangs (NVIDIA/nccl#863, #1777), a
``destroy()`` that waits for every rank (and runs at garbage collection,
as cupy's ``__dealloc__`` does), a first ``allReduce`` that connects
inside the call (NCCL >= 2.22). The stand-in's "forever" is :data:`HANG_S`;
every bound checked here is well below it, so each test fails without its
fix instead of hanging. Nothing here says anything about NCCL, CUDA or a GPU.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import pytest
import torch
import torch.distributed as dist
from helpers.nccl_strict import MemoryStore, StandInHang, StrictNccl

from commrt.errors import CommError, CommTimeoutError
from commrt.transports.nccl import NcclTransport
from commrt.transports.nccl_bootstrap import init_nccl, uid_bytes
from commrt.transports.nccl_module import CupyNccl
from commrt.transports.watchdog import Watchdog

#: how long the stand-in's blocking calls last before they give up (real NCCL: forever)
HANG_S = 4.0
#: the transports' abort and destroy bounds in these tests
BOUND_S = 0.5


def transports(n: int = 2, timeout: float = 0.5, **modes) -> list[NcclTransport]:
    """``n`` transports over the strict stand-in, made together (creation is collective)."""
    store, uid = MemoryStore(), os.urandom(128)
    out: list = [None] * n

    def make(r):
        nccl = StrictNccl(store, hang_s=HANG_S, **modes)
        out[r] = NcclTransport(r, n, uid, torch.device("cpu"), nccl=nccl, timeout=timeout)
        out[r].abort_s = out[r].destroy_s = BOUND_S

    threads = [threading.Thread(target=make, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(t is not None for t in out), out
    return out


def both(fn0, fn1, limit: float = 10.0) -> list:
    """``fn0()`` here and ``fn1()`` on a thread, together; both results (errors raised)."""
    box: list = [None, None]

    def side(i, fn):
        try:
            box[i] = fn()
        except BaseException as e:  # noqa: BLE001 - raised below
            box[i] = e

    t = threading.Thread(target=side, args=(1, fn1), daemon=True)
    t.start()
    side(0, fn0)
    t.join(limit)
    for got in box:
        if isinstance(got, BaseException):
            raise got
    return box


def connect(t0: NcclTransport, t1: NcclTransport) -> None:
    """One message each way, so that later groups between the two never wait in groupEnd."""

    def side(t, peer):
        out, into = torch.ones(2), torch.zeros(2)  # alive until the stand-in has moved them
        pend = t.exchange([(out, peer)], [(into, peer)], 0)
        deadline = time.monotonic() + 10
        return pend.wait_recv(0, deadline) and pend.wait_send(0, deadline)

    assert both(lambda: side(t0, 1), lambda: side(t1, 0)) == [True, True]


# ------------------------------------------------------------ item 4: abort and destroy
def test_an_abort_that_hangs_costs_its_bound_not_the_wait():
    """A receive its peer never sends: at the deadline the transport aborts, and the abort
    hangs. The wait gives up after the abort's bound (it used to hang with the abort);
    close() then neither destroys nor aborts again."""
    t0, t1 = transports(abort_blocks=True)
    try:
        connect(t0, t1)
        into = torch.zeros(4)  # kept: the aborted receive may still hold its pointer
        pend = t0.exchange([], [(into, 1)], 0)
        start = time.monotonic()
        assert not pend.wait_recv(0, time.monotonic() + 0.3)
        assert time.monotonic() - start < 0.3 + BOUND_S + 1.0
        assert "did not finish" in t0.broken
        comm = t0.comm
        start = time.monotonic()
        t0.close()
        assert time.monotonic() - start < 0.5 and not comm.destroyed and not comm.aborted
    finally:
        t0.nccl.release.set()
        t1.nccl.release.set()
        t1.close()


def test_the_watchdog_ends_the_process_on_time_when_the_abort_hangs():
    """groupEnd waits for a peer that never comes; the watchdog's abort hangs. The grace
    is counted from the timeout, not from the abort's return: the exit comes at timeout
    + grace (it used to wait for the abort, and the process never ended)."""
    t0, t1 = transports(timeout=0.5, abort_blocks=True)
    exits: list = []
    t0.watchdog = Watchdog(grace_s=0.3, exit=lambda code: exits.append((code, time.monotonic())))
    errors: list = []

    out = torch.ones(4)

    def stuck():
        try:
            t0.exchange([(out, 1)], [], 0)
        except Exception as e:  # noqa: BLE001 - looked at below
            errors.append(e)

    start = time.monotonic()
    threading.Thread(target=stuck, daemon=True).start()
    try:
        deadline = start + 3.0
        while not exits and time.monotonic() < deadline:
            time.sleep(0.01)
        assert exits and exits[0][0] == 1, "the watchdog never ended the process"
        assert exits[0][1] - start < 0.5 + 0.3 + 0.7, exits
    finally:
        t0.nccl.release.set()
    deadline = time.monotonic() + HANG_S + 2
    while not errors and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(errors[0], CommTimeoutError), errors
    t1.close()


def test_a_healthy_close_bounds_destroy():
    """destroy() waits for every rank's: a rank whose peer has not closed yet leaves close()
    after the bound (it used to wait as long as the peer took)."""
    t0, t1 = transports(collective_destroy=True)
    connect(t0, t1)
    comm, other = t0.comm, t1.comm
    start = time.monotonic()
    t0.close()
    assert time.monotonic() - start < BOUND_S + 1.0
    assert t0.broken is None and t0.comm is None and not comm.destroyed
    t1.close()  # rank 0's destroy is there: rank 1's returns, and rank 0's too
    deadline = time.monotonic() + 5
    while not comm.destroyed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert comm.destroyed and other.destroyed


def test_garbage_collection_never_waits_for_destroy():
    """A transport dropped without close(): its communicator is destroyed on a thread of its
    own, not by cupy's __dealloc__ inside the collection (which waited for the other rank)."""
    ts = transports(collective_destroy=True)
    t1 = ts.pop()
    comm = weakref.ref(ts[0].comm)
    start = time.monotonic()
    ts.clear()  # the last reference to rank 0's transport
    gc.collect()
    # a collection that waited for the destroy would wait until t1.close() below, for good:
    # any bound tells; 30 s holds on a loaded machine (5.5 s was seen beside 5 busy workers)
    assert time.monotonic() - start < 30.0
    assert comm() is not None and not comm().destroyed  # its destroy waits for rank 1
    t1.close()
    deadline = time.monotonic() + 5
    while not comm().destroyed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert comm().destroyed


# ------------------------------------------------------------ item 8: lazy connect
def test_a_barrier_that_connects_lazily_is_bounded():
    """NCCL >= 2.22 connects a communicator's peers inside its first collective's call: a
    barrier whose peer never comes blocked there (outside the watchdog, for good). Now it
    ends at its timeout with the communicator aborted; the native all-reduce likewise."""
    t0, t1 = transports(lazy_connect=True)
    start = time.monotonic()
    assert t0.barrier(0.5) is False
    assert time.monotonic() - start < 0.5 + 1.0 and t0.broken == "allReduce timed out"
    t1.close()
    t0, t1 = transports(lazy_connect=True)
    ones = torch.ones(3)
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"connection setup in allReduce \(peers \[1\]\)"):
        t0.native_all_reduce(ones)
    assert time.monotonic() - start < 0.5 + 1.0
    t1.close()
    t0, t1 = transports(timeout=10, lazy_connect=True)  # both come: it connects and sums
    got = [torch.full((3,), 1.0), torch.full((3,), 2.0)]
    assert both(lambda: t0.barrier(10), lambda: t1.barrier(10)) == [True, True]
    both(lambda: t0.native_all_reduce(got[0]), lambda: t1.native_all_reduce(got[1]))
    assert all(torch.equal(g, torch.full((3,), 3.0)) for g in got)
    t0.close()
    t1.close()


# ------------------------------------------------------------ item 8: dtypes
def test_bool_moves_and_reduces_as_uint8_int16_moves_as_bytes_others_are_named():
    t0, t1 = transports(timeout=10)
    connect(t0, t1)
    sent = [torch.tensor([True, False, True]), torch.arange(-3, 4, dtype=torch.int16) * 1000]
    got = [torch.zeros(3, dtype=torch.bool), torch.zeros(7, dtype=torch.int16)]
    before = len(t0.nccl.calls)

    def send():
        return t0.exchange([(s, 1) for s in sent], [], 0).wait_send(1, time.monotonic() + 10)

    def recv():
        return t1.exchange([], [(g, 0) for g in got], 0).wait_recv(1, time.monotonic() + 10)

    assert both(send, recv) == [True, True]
    assert torch.equal(got[0], sent[0]) and torch.equal(got[1], sent[1])
    # (op, count, ncclDataType_t, peer): bool element by element, int16 as 2 bytes each
    assert t0.nccl.calls[before:] == [("send", 3, 1, 1), ("send", 14, 1, 1)]
    # a sum of bools is an or (ProcessGroupNCCL: MAX on uint8), never a 2 in a bool's byte
    flags = [torch.tensor([True, True, False]), torch.tensor([True, False, False])]
    both(lambda: t0.native_all_reduce(flags[0]), lambda: t1.native_all_reduce(flags[1]))
    for f in flags:
        assert f.view(torch.uint8).tolist() == [1, 1, 0]
    with pytest.raises(ValueError, match="NCCL cannot sum torch.int16 tensors"):
        t0.native_all_reduce(torch.ones(2, dtype=torch.int16))
    with pytest.raises(ValueError, match="NCCL cannot avg torch.bool tensors"):
        t0.native_all_reduce(torch.ones(2, dtype=torch.bool), "avg")
    with pytest.raises(ValueError, match="NCCL cannot move torch.complex64"):
        t0.exchange([(torch.ones(2, dtype=torch.complex64), 1)], [], 0)
    assert t0.broken is None  # refused before a group opened
    t0.close()
    t1.close()


# ------------------------------------------------------------ item 8: cupy 13's unique id
class Cupy13:
    """cupy 13's ``cupy.cuda.nccl`` as far as making a communicator: ``get_unique_id()``
    returns a tuple of 128 signed chars and ``NcclCommunicator`` declares ``tuple commId``
    (bytes are refused by type; each entry must fit a C char)."""

    def __init__(self):
        self.ids: list[tuple] = []
        outer = self

        class NcclCommunicator:
            def __init__(self, ndev, commId, rank):  # noqa: N803
                if not isinstance(commId, tuple):
                    raise TypeError(
                        "Argument 'commId' has incorrect type "
                        f"(expected tuple, got {type(commId).__name__})"
                    )
                if len(commId) != 128 or not all(-128 <= c <= 127 for c in commId):
                    raise OverflowError("value too large to convert to char")
                outer.ids.append(commId)

            def destroy(self):
                pass

        self.NcclCommunicator = NcclCommunicator

    def get_unique_id(self) -> tuple:
        return tuple(b - 256 if b > 127 else b for b in os.urandom(128))


def test_cupy_13_gets_its_unique_id_as_a_tuple_of_signed_chars(monkeypatch):
    nccl = Cupy13()
    uid = nccl.get_unique_id()
    NcclTransport(
        0, 1, uid_bytes(uid), torch.device("cpu"), nccl=CupyNccl(nccl), timeout=30
    ).close()
    assert nccl.ids == [uid]
    # through the store, as init does: rank 0's id, published as bytes, reaches cupy 13 whole
    monkeypatch.setattr(nccl, "get_unique_id", lambda: uid)
    init_nccl(0, 1, 0, "cpu", CupyNccl(nccl), make_store=dist.HashStore, timeout=30).close()
    assert nccl.ids == [uid, uid]


def test_the_stand_ins_blocking_modes_block():
    """The modes themselves: each call blocks until its condition (or the stand-in's
    HANG_S), so the tests above measure commrt's bounds, not a stand-in that returns."""
    t0, t1 = transports(abort_blocks=True)
    start = time.monotonic()
    with pytest.raises(StandInHang, match="abort"):
        t0.comm.abort()
    assert time.monotonic() - start >= HANG_S - 0.1
    t0.nccl.release.set()
    t0.comm.abort()  # released: returns at once
    t1.close()


# ------------------------------------------------------------ a call refused inside a group
def test_a_call_refused_inside_a_group_launches_nothing_and_is_the_error_raised():
    """The receive of a group fails before NCCL sees it (as cupy's argument conversion
    does), after its send was enqueued. The group used to be closed in a ``finally``,
    launching that lone send (which the peer took for another message) and raising the
    TypeError as bad input that leaves the group usable. Now nothing of the group
    launches, the communicator is aborted, the error names the refusal, and the thread's
    group is closed: the same thread's next NCCL call is not swallowed by it."""
    t0, t1 = transports(timeout=10)
    try:
        connect(t0, t1)
        launched = len(t0.nccl.launched)

        def refused(*args):
            raise TypeError("an integer is required")

        t0.comm.recv = refused
        out, into = torch.ones(4), torch.zeros(4)
        with pytest.raises(CommError, match="NCCL refused a call: an integer is required"):
            t0.exchange([(out, 1)], [(into, 1)], 0)
        assert t0.nccl.launched[launched:] == [] and t0.nccl.depth == 0
        assert "a call of a group failed: TypeError" in t0.broken, t0.broken
    finally:
        t0.close()
        t1.close()


# ------------------------------------------------------------ the stand-in matches as NCCL
def test_the_strict_stand_in_names_a_subset_and_matches_in_issue_order():
    """Two of three ranks create a communicator: both are told that rank 2 never came.
    Then, on one communicator, rank 0 issues an all-reduce and a send, rank 1 a receive
    and an all-reduce: NCCL has no tags, so the receive takes the all-reduce's message
    (here a count mismatch, reported as NCCL reports asynchronous errors)."""
    store, uid, errors = MemoryStore(), os.urandom(128), []

    def make(r):
        try:
            NcclTransport(
                r, 3, uid, torch.device("cpu"), nccl=StrictNccl(store, hang_s=1.0), timeout=30
            )
        except StandInHang as e:
            errors.append(str(e))

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(errors) == 2 and all("waits for ranks [2], which never" in e for e in errors)
    t0, t1 = transports(timeout=10)
    try:
        connect(t0, t1)
        sums, x, got = [torch.ones(3), torch.ones(3)], torch.ones(5), torch.zeros(5)

        def rank0():
            before = len(t0.nccl.launched)
            threading.Thread(target=_quietly, args=(t0.native_all_reduce, sums[0])).start()
            while len(t0.nccl.launched) == before:  # the all-reduce is issued first
                time.sleep(1e-3)
            return t0.exchange([(x, 1)], [], 0)

        def rank1():
            pend = t1.exchange([], [(got, 0)], 0)
            assert not pend.wait_recv(0, time.monotonic() + 5)

        with pytest.raises(CommError, match="rank 0 sends 3 x float32 to rank 1, which rec"):
            both(rank0, rank1)
    finally:
        t0.close()
        t1.close()


def _quietly(fn, *args) -> None:
    """``fn(*args)``, its error dropped (the test looks at the peer's)."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001, S110
        pass
