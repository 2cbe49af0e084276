"""Every AVG path of commrt on values whose sum overflows the dtype but whose average fits
(tests/multiprocess/test_average_rule.py).

    average_worker.py BACKEND OUT_DIR

BACKEND: gloo, shm, mpi (under mpiexec) or cuda_ipc (the strict CPU stand-in device).
Every rank holds ``BIG[dtype]`` in every element, fp16 and bf16: the rule (1/p applied to
each input before the sum) gives ``BIG`` back; dividing after the sum gives inf. Each
rank writes OUT_DIR/rank<r>.json: path -> the first element of its result per dtype.
"""

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from helpers.engines import init_with  # noqa: E402
from helpers.ipc_standin import StandInDevice  # noqa: E402

import commrt  # noqa: E402
from commrt.distributed.hooks import AllReduceState, allreduce_hook  # noqa: E402

#: per dtype, a value whose sum over 4 ranks overflows and whose average is itself
BIG = {torch.float16: 40000.0, torch.bfloat16: 2.0e38}
N = 64


class _Bucket:
    """What DDP hands a communication hook: its buffer and its index."""

    def __init__(self, buf: torch.Tensor):
        self.buf = buf

    def buffer(self) -> torch.Tensor:
        return self.buf

    def index(self) -> int:
        return 0


def _paths(comm, dtype):
    """path -> a function of a fresh tensor of BIG returning the averaged result."""
    p = comm.world_size

    def reduce_scatter(t):
        out = torch.empty(N // p, dtype=dtype)
        return commrt.reduce_scatter(out, t, comm, op="avg")

    def native(t):
        comm.transport.native_all_reduce(t, "avg")
        return t

    def hook(t):
        return allreduce_hook(AllReduceState(comm), _Bucket(t)).wait()

    def hook_wire(t):  # a float32 bucket on a wire of the dtype: pack scales, then casts
        state = AllReduceState(comm, comm_dtype=dtype)
        return allreduce_hook(state, _Bucket(t.float())).wait()

    def sync(t):
        model = torch.nn.Linear(N, 1, bias=False).to(dtype)
        grads = commrt.GradientSync(model, comm, algorithm="ring")
        (model.weight.view(-1) * t).sum().backward()  # .grad = t
        grads.wait()
        grads.close()
        return model.weight.grad.view(-1)

    paths = {
        "all_reduce": lambda t: commrt.all_reduce(t, comm, op="avg"),
        "reduce_scatter": reduce_scatter,
        "native": native,
        "hook": hook,
        "hook wire": hook_wire,
        "GradientSync": sync,
    }
    if comm.transport.name == "mpi" and dtype == torch.bfloat16:
        del paths["native"]  # MPI has no bfloat16 reduction (a named TypeError)
    return paths


def main(backend: str, out: str) -> None:
    if backend == "cuda_ipc":
        dev = StandInDevice(seed=int(os.environ["RANK"]))
        comm = init_with("cuda_ipc", dev, timeout=60, stall_s=0)
    else:
        comm = commrt.init(backend, timeout=60)
    report = {}
    for dtype, big in BIG.items():
        for path, run in _paths(comm, dtype).items():
            got = run(torch.full((N,), big, dtype=dtype))
            held = float(torch.tensor(big, dtype=dtype))  # BIG as the dtype holds it
            report[f"{path} {str(dtype)[6:]}"] = float(got[0]) / held
    comm.close()
    with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
