"""What an all-reduce does with the pieces it receives: :class:`ReduceOp`, and the dtypes
each op takes (:class:`DtypeRules`).

Every op runs the same schedule through the same executor call
(:meth:`commrt.Communicator.run_schedule`); only the step that meets a received
piece differs. SUM and AVG add it with the executor's own sum (commrt's fused
kernels on CUDA; AVG scales the input by one over the ranks first,
:func:`commrt.collectives.memo.average_scale`); MIN, MAX, PROD and the
bitwise BAND, BOR and BXOR apply their :data:`REDUCERS` function in place.

Two sets of dtype rules, checked before any message, so a refusal is raised on
every rank alike (they all hold the same dtype):

* :data:`COMMRT`, :func:`commrt.all_reduce`'s: ``sum`` on float32, float64,
  float16, bfloat16, int32 and int64 (:data:`SUPPORTED_DTYPES`); ``avg`` on the
  floats among them; ``min``, ``max`` and ``prod`` on those and int8, uint8,
  int16 and bool; the bitwise ops on those integers and bool.
* :data:`TORCH`, the torch.distributed backend's, as gloo and NCCL take them:
  every dtype for sum (int8, uint8, int16 and bool included: a bool sum is an
  or), min, max and prod; the bitwise ops on any integer or bool dtype; avg as
  commrt's.
"""

from __future__ import annotations

import enum

import torch

from commrt.errors import did_you_mean

__all__ = ["ReduceOp", "SPELLINGS", "REDUCERS", "BITWISE", "DtypeRules", "COMMRT", "TORCH"]
__all__ += ["SUPPORTED_DTYPES", "NAMED_DTYPES"]

#: dtypes :func:`commrt.all_reduce` sums (and averages, the floats among them)
SUPPORTED_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
)
#: the dtypes a call description can name (commrt.collectives.core): SUPPORTED_DTYPES first
#: (their codes stay put), then the narrow integers and bool that min, max, prod and the
#: bitwise ops also take
NAMED_DTYPES = SUPPORTED_DTYPES + (torch.int8, torch.uint8, torch.int16, torch.bool)


class ReduceOp(enum.Enum):
    """An all-reduce's op; :meth:`parse` takes its value (``"sum"``, ...) or a member."""

    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    PROD = "prod"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    @classmethod
    def parse(cls, op: "str | ReduceOp") -> "ReduceOp":
        """The member ``op`` names, in any case (``"product"``, torch's name, is PROD); a
        ValueError naming the choices otherwise."""
        found = SPELLINGS.get(op) if isinstance(op, (str, cls)) else None
        if found is None:
            found = SPELLINGS.get(str(op).lower())
        if found is None:
            choices = ", ".join(f"'{m.value}'" for m in cls)
            near = OTHER_NAMES.get(str(op).lower())
            hint = f"; did you mean {near!r}?" if near else did_you_mean(op, (m.value for m in cls))
            raise ValueError(f"unknown op {op!r}; choose one of {choices}{hint}")
        return found


#: every spelling :meth:`ReduceOp.parse` takes, looked up without the enum machinery
SPELLINGS: dict = {m.value: m for m in ReduceOp} | {m: m for m in ReduceOp}
SPELLINGS["product"] = ReduceOp.PROD
#: what other libraries call an op (numpy's mean, Python's and/or/xor), for the hint of an
#: unknown op: spelling alone finds no op near "mean"
OTHER_NAMES = {"mean": "avg", "average": "avg", "and": "band", "or": "bor", "xor": "bxor"}

#: the ops defined on integers and bool only
BITWISE = frozenset({ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR})


def _minimum(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.minimum(dst, src, out=dst)


def _maximum(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.maximum(dst, src, out=dst)


def _product(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.mul_(src)


def _band(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.bitwise_and_(src)


def _bor(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.bitwise_or_(src)


def _bxor(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.bitwise_xor_(src)


#: per op, ``reduce(dst, src)`` in place for a received piece; SUM and AVG are absent: they
#: take the executor's own sum (None)
REDUCERS = {
    ReduceOp.MIN: _minimum,
    ReduceOp.MAX: _maximum,
    ReduceOp.PROD: _product,
    ReduceOp.BAND: _band,
    ReduceOp.BOR: _bor,
    ReduceOp.BXOR: _bxor,
}


def _names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


class DtypeRules:
    """Per op, the dtypes it reduces (None: any dtype), and :meth:`check`'s error for the
    others (module docs)."""

    def __init__(self, name: str, dtypes: dict):
        self.name = name
        self.dtypes = dtypes

    def check(self, dtype: torch.dtype, op: ReduceOp) -> None:
        """Return if ``op`` reduces ``dtype``; else a ValueError that says why."""
        if op in BITWISE and (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(f"reduce op {op.name} needs an integer or bool tensor, got {dtype}")
        allowed = self.dtypes[op]
        if allowed is None or dtype in allowed:
            return
        if op is ReduceOp.AVG and dtype in SUPPORTED_DTYPES:
            raise ValueError(f"op='avg' needs a floating-point tensor, got {dtype}; use op='sum'")
        raise ValueError(
            f"unsupported dtype {dtype} for op='{op.value}'; it reduces {_names(allowed)}"
        )

    def __repr__(self) -> str:
        return f"DtypeRules({self.name})"


_FLOATS = frozenset(d for d in SUPPORTED_DTYPES if d.is_floating_point)
_NAMED = frozenset(NAMED_DTYPES)
_INTEGERS = frozenset(d for d in NAMED_DTYPES if not d.is_floating_point)

#: :func:`commrt.all_reduce`'s rules (module docs)
COMMRT = DtypeRules(
    "commrt",
    {
        ReduceOp.SUM: frozenset(SUPPORTED_DTYPES),
        ReduceOp.AVG: _FLOATS,
        **{op: _NAMED for op in (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PROD)},
        **{op: _INTEGERS for op in BITWISE},
    },
)
#: the torch.distributed backend's rules, as gloo's and NCCL's (module docs)
TORCH = DtypeRules("torch", {**{op: None for op in ReduceOp}, ReduceOp.AVG: _FLOATS})
