"""``commrt.runtime.rows.gather`` on ranks that are threads: every rank's row, on every
rank, in rank order, for each dtype its callers use, and nothing left over from the last
gather in a kept table."""

import math

import torch
from helpers.local_transport import run_ranks

from commrt.process.environment import LaunchInfo
from commrt.runtime import rows
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator


def _comm(tr):
    info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
    return Communicator(tr, Backend.GLOO, info, 10.0, 1 << 20)


def test_every_rank_gets_every_row_in_rank_order_and_nothing_stale():
    p = 3

    def body(tr):
        comm, r = _comm(tr), tr.rank
        return [
            rows.gather(comm, [r + 0.5, math.nan if r == 1 else -r, 1e300]),
            rows.gather(comm, [r, 2**62 + r], torch.int64),
            rows.gather(comm, [r, -1], torch.int8),
            rows.gather(comm, [r + 0.5, -r, 7.0]),  # the first one's kept table, again
        ]

    for got in run_ranks(p, body):
        floats, ints, small, again = got
        assert [row[0] for row in floats] == [0.5, 1.5, 2.5]
        assert floats[0][1] == 0 and math.isnan(floats[1][1]) and floats[2][1] == -2
        assert all(row[2] == 1e300 for row in floats)
        assert ints == [[r, 2**62 + r] for r in range(p)]
        assert small == [[r, -1] for r in range(p)]
        assert again == [[r + 0.5, -r, 7.0] for r in range(p)]
