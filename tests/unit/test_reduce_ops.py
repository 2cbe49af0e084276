"""commrt.all_reduce's ops beyond sum and avg (min, max, prod and the bitwise ones): each
runs the same path as a sum (the same settled memo, executor and bindings), gives torch's
answer, and refuses a dtype it does not reduce before any message, naming why."""

import pytest
import torch
from helpers.local_transport import run_ranks

import commrt
from commrt.collectives.memo import last_settled
from commrt.collectives.reductions import TORCH, ReduceOp
from commrt.process.environment import LaunchInfo
from commrt.runtime.choice import Backend
from commrt.runtime.communicator import Communicator


def _comm(tr):
    info = LaunchInfo("none", tr.rank, tr.world_size, 0, None)
    return Communicator(tr, Backend.GLOO, info, 10.0, 1 << 20)


def _inputs(rank: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (6,), generator=g).bool()
    return torch.randint(1, 9, (6,), generator=g).to(dtype)


CASES = [
    ("min", torch.float32, lambda a, b: torch.minimum(a, b)),
    ("max", torch.int64, lambda a, b: torch.maximum(a, b)),
    ("prod", torch.float64, lambda a, b: a * b),
    ("product", torch.int32, lambda a, b: a * b),
    (ReduceOp.MAX, torch.int8, lambda a, b: torch.maximum(a, b)),
    ("band", torch.int32, lambda a, b: a & b),
    ("BOR", torch.uint8, lambda a, b: a | b),
    ("bxor", torch.int64, lambda a, b: a ^ b),
    ("bor", torch.bool, lambda a, b: a | b),
]


@pytest.mark.parametrize("op,dtype,want", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_op_gives_torchs_answer_and_settles_like_a_sum(op, dtype, want):
    def body(tr):
        comm = _comm(tr)
        out = []
        for _ in range(3):  # the first call settles it, the others repeat it
            x = _inputs(tr.rank, dtype)
            out.append(commrt.all_reduce(x, comm, algorithm="rd", op=op))
        grid = torch.zeros(6, 2, dtype=dtype)  # a strided view: through a contiguous copy
        grid[:, 1] = _inputs(tr.rank, dtype)
        commrt.all_reduce(grid[:, 1], comm, algorithm="rd", op=op)
        return out, grid, last_settled(comm) is not None

    expected = want(_inputs(0, dtype), _inputs(1, dtype))
    for out, grid, settled in run_ranks(2, body):
        assert settled
        assert all(torch.equal(o, expected) for o in out)
        assert torch.equal(grid[:, 1], expected) and not grid[:, 0].any()


def test_ops_alternating_on_one_buffer_never_reuse_each_others_binding():
    def body(tr):
        comm = _comm(tr)
        x = torch.empty(4)
        got = []
        for _ in range(3):
            for op in ("sum", "min", "max", "prod", "avg"):
                x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]) * (tr.rank + 2))
                got.append(commrt.all_reduce(x, comm, algorithm="rd", op=op).tolist())
        return got

    a, b = [2.0, 4.0, 6.0, 8.0], [3.0, 6.0, 9.0, 12.0]
    want = [
        [x + y for x, y in zip(a, b)],
        a,
        b,
        [x * y for x, y in zip(a, b)],
        [(x + y) / 2 for x, y in zip(a, b)],
    ] * 3
    assert run_ranks(2, body) == [want, want]


def test_dtypes_an_op_does_not_take_are_refused_before_any_message():
    def body(tr):
        comm = _comm(tr)
        with pytest.raises(ValueError, match="reduce op BAND needs an integer or bool tensor"):
            commrt.all_reduce(torch.ones(2), comm, op="band")
        with pytest.raises(ValueError, match="unsupported dtype torch.complex64 for op='max'"):
            commrt.all_reduce(torch.ones(2, dtype=torch.complex64), comm, op="max")
        with pytest.raises(ValueError, match="unsupported dtype torch.int8 for op='sum'"):
            commrt.all_reduce(torch.ones(2, dtype=torch.int8), comm, op="sum")
        with pytest.raises(ValueError, match="unknown op 'mean'; choose one of 'sum', 'avg'"):
            commrt.all_reduce(torch.ones(2), comm, op="mean")
        with pytest.raises(ValueError, match="did you mean 'avg'"):  # numpy's name
            commrt.all_reduce(torch.ones(2), comm, op="mean")
        with pytest.raises(ValueError, match="did you mean 'max'"):  # a slip of the key
            commrt.all_reduce(torch.ones(2), comm, op="mxa")
        with pytest.raises(ValueError, match="reduce_scatter: op must be 'sum' or 'avg'"):
            commrt.reduce_scatter(torch.empty(1), torch.ones(2), comm, op="max")
        # a torch.distributed group's communicator takes gloo's dtypes: an int8 sum wraps
        comm.slots.dtype_rules = TORCH
        x = torch.full((2,), 100, dtype=torch.int8)
        return commrt.all_reduce(x, comm, algorithm="rd", op="sum").tolist()

    assert run_ranks(2, body) == [[-56, -56]] * 2


def test_the_default_average_is_said_where_a_torch_user_looks_first():
    """torch sums by default and commrt.all_reduce averages: its docstring's first line
    and the from-DDP page say so."""
    import inspect
    from pathlib import Path

    first = inspect.getdoc(commrt.all_reduce).splitlines()[0]
    assert first.startswith("Average") and 'op="sum"' in first
    page = (Path(__file__).parents[2] / "docs" / "from-ddp.md").read_text()
    assert "`commrt.all_reduce(t, comm)` **averages** by default" in page
