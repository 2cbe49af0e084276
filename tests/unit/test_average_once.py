"""An average is applied exactly once on every route that averages: commrt.all_reduce
with op="avg" (its first call, a settled call found by signature, and a repeat on the
same tensor), the torch.distributed backend's AVG (the op the process group queues) and
GradientSync's average of gradients. Three ranks, so that an average applied twice (1/9)
or not at all (the sum) is far from the float64 reference, and 1/3 is not exact in binary.

Ranks are threads over an in-process transport (helpers.local_transport)."""

from __future__ import annotations

import pytest
import torch
from helpers.local_transport import run_ranks

import commrt
from commrt.algorithms import resolve
from commrt.distributed.ops import DeviceContext
from commrt.distributed.ops import allreduce as torch_allreduce
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator

P = 3


def _comm(tr) -> Communicator:
    return Communicator(
        tr, Backend.GLOO, LaunchInfo("none", tr.rank, tr.world_size, 0, None), 20.0, 1 << 20
    )


def _inputs(rank: int, k: int, n: int = 37) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * k + rank))


def _mean(k: int, n: int = 37) -> torch.Tensor:
    return sum(_inputs(r, k, n).double() for r in range(P)) / P


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("route", ["commrt", "torch"])
def test_an_all_reduce_average_equals_the_float64_mean(route, dtype):
    """Four calls on one tensor: the first (select, run), the second (the settled memo by
    signature), the third and fourth (the repeat on the same tensor)."""

    def body(tr):
        comm = _comm(tr)
        dc = DeviceContext(comm, resolve("ring"))
        x, out = torch.empty(37, dtype=dtype), []
        for k in range(4):
            x.copy_(_inputs(tr.rank, k))
            if route == "commrt":
                commrt.all_reduce(x, comm, algorithm="ring", op="avg")
            else:
                torch_allreduce(dc, x, "avg")
            out.append(x.double().clone())
        return out

    tol = dict(rtol=2**-7, atol=2**-7) if dtype is torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    for out in run_ranks(P, body):
        for k, got in enumerate(out):
            torch.testing.assert_close(got, _mean(k), **tol, msg=f"call {k}")


def test_gradient_sync_averages_gradients_once():
    """Each rank's gradient of a linear model on its own input: after the step, every
    rank holds the float64 mean of the three."""
    w0 = torch.randn(5, 4, generator=torch.Generator().manual_seed(7))

    def grad_of(rank: int) -> torch.Tensor:
        x = _inputs(rank, 99, 4 * 6).view(6, 4).double()
        return 2 * (x @ w0.double().T).T @ x  # d/dW of sum((x W^T)^2)

    def body(tr):
        comm = _comm(tr)
        model = torch.nn.Linear(4, 5, bias=False)
        with torch.no_grad():
            model.weight.copy_(w0)
        with commrt.GradientSync(model, comm, broadcast_init=False) as sync:
            x = _inputs(tr.rank, 99, 4 * 6).view(6, 4)
            model(x).square().sum().backward()
            sync.wait()
            return model.weight.grad.double().clone()

    want = sum(grad_of(r) for r in range(P)) / P
    for got in run_ranks(P, body):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
