"""The executor checked exactly on the in-process transport, for any all-reduce schedule."""

import torch

from commrt.schedule.executor import Executor
from helpers.local_transport import run_ranks


def assert_executor_exact(sched, piece_bytes):
    """Every rank of ``sched`` (on the in-process transport) ends with the exact sum of
    integer-valued float64 inputs, for buffers of 1 to 4099 elements (fewer than the
    chunks too); tests/unit/test_pipelined_torus.py uses it as well."""
    p = sched.world_size
    for n in (1, 7, 1000, 4099):
        xs = [
            torch.randint(-50, 50, (n,), generator=torch.Generator().manual_seed(r + n)).double()
            for r in range(p)
        ]
        want = torch.stack(xs).sum(0)

        def body(tr):
            buf = xs[tr.rank].clone()  # noqa: B023 (run_ranks finishes inside this iteration)
            Executor().run(sched, buf, tr, timeout=10, piece_bytes=piece_bytes)
            return buf

        for r, out in enumerate(run_ranks(p, body)):
            assert torch.equal(out, want), f"{sched.name} n={n} rank {r}"
