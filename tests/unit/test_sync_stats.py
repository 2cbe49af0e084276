"""``print(sync.stats)``: numbers that agree with themselves. The step's parts add up to the
step's time with the rest named, the progress thread's work is not passed off as a part of
it, counts agree in number, sizes are in the one binary unit system, every value starts in
one column, and the block ends a line (ranks' blocks ran together under mpiexec)."""

import re

from commrt.sim.links import fmt_bytes
from commrt.sync.stats import StepStats, SyncStats, tile

PARTS = ("  backward", "  waiting", "  optimizer", "  the rest")


def _stats(steps: int = 3, buckets: int = 1) -> SyncStats:
    s = SyncStats(rank=1, world_size=2, transport="shm (auto)")
    for i in range(steps):
        s.add(
            StepStats(
                step=i, step_s=7.22e-3, backward_s=2.104e-3, pack_s=0.07e-3, comm_s=4.28e-3,
                unpack_s=0.63e-3, exposed_s=3.337e-3, optimizer_s=0.6251e-3, bytes_sent=41943,
                buckets=buckets,
            )
        )  # fmt: skip
    s.algorithms, s.buffer_bytes, s.grad_bytes = ("ring",) * buckets, 83886, 41943
    return s


def _ms(value: str) -> float:
    return float(re.match(r"([\d.]+) ms", value).group(1))


def test_the_steps_parts_add_up_to_its_time_and_the_rest_is_named():
    rows = dict(_stats().rows())
    total = _ms(rows["step time"])
    assert total == 7.22
    parts = [_ms(rows[p]) for p in PARTS]
    assert round(sum(parts), 2) == total, rows
    assert "forward" in rows["  the rest"]
    # pack, comm and unpack are the progress thread's, beside the step, and say so
    assert rows["progress thread"].startswith("4.98 ms: pack 0.07 + comm 4.28 + unpack 0.63")


def test_rounded_parts_still_add_up_when_the_rest_rounds_below_zero():
    ms = tile(3.01e-3, [1.006e-3, 1.006e-3, 1.006e-3])  # 1.01 x 3 > 3.01, as printed
    assert round(sum(ms), 2) == 3.01 and ms[-1] == 0 and min(ms) >= 0, ms


def test_counts_agree_in_number_and_sizes_are_binary_with_their_precision():
    one = dict(_stats(buckets=1).rows())
    assert one["bytes sent per step"] == "40.96 KiB in 1 bucket"
    assert dict(_stats(buckets=3).rows())["bytes sent per step"].endswith("in 3 buckets")
    # the gradients are as precise as what is sent (it said "gradients 0.0 MB" beside 0.04)
    assert one["extra memory"] == "81.92 KiB (gradients 40.96 KiB)"
    assert fmt_bytes(41943) == "40.96 KiB" and fmt_bytes(25 << 20) == "25 MiB"


def test_every_value_starts_in_one_column_and_the_block_ends_a_line():
    text = str(_stats())
    assert text.endswith("\n") and not text.endswith("\n\n")
    head, *lines = text.splitlines()
    assert head == "rank 1 of 2, transport shm (auto)"
    starts = {len(re.match(r"(\s*\S+(?: \S+)*\s{2,})", line).group(1)) for line in lines}
    assert len(starts) == 1, lines
    assert max(map(len, text.splitlines())) <= 80, text
