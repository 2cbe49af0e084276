"""Run under mpiexec: ``auto`` learning on real ranks, and a saved calibration.

argv: out.json, calibration path. Rank 0 probes and saves the calibration;
then every rank loads it with Auto(calibration=...) on a fresh
communicator and runs 4 KiB all-reduces with an Auto priced on a network
a thousand times too fast, so every choice misses its prediction and the
runner-up is tried. Rank 1 sleeps inside 3 of the 5 timed calls of the watch
phase (injected delay) so that the ranks' own times differ: they must
still decide alike. Rank 0 writes every rank's tuning state and results.
"""

import dataclasses
import os
import sys
import time

import torch
from mpi4py import MPI
from mpi_report import write_ranks

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import commrt  # noqa: E402
from commrt.algorithms import Auto  # noqa: E402
from commrt.algorithms.auto import candidates, choices, learning  # noqa: E402
from commrt.algorithms.auto_learn import calls_to_settle  # noqa: E402
from commrt.tuning.probe import probe  # noqa: E402

N = 1024  # floats: 4 KiB
# watch: 1 + 5 calls; trial: 5 calls per candidate predicted near the choice. How many
# that is depends on the candidate list, so the loop runs until every rank's (agreed)
# state is settled, up to a bound that only a learning stuck in its trial reaches.
MAX_CALLS = calls_to_settle(len(candidates(4))) + 10


def main(out_path, calib):
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    comm = commrt.init("mpi", timeout=60)
    pr = probe(comm, repeats=3)
    if rank == 0:
        pr.save(calib)
    comm.barrier()
    comm.close()
    comm = commrt.init("mpi", timeout=60)
    loaded = Auto(calibration=calib)
    net = probe(comm, calibration=calib).network()
    fast = dataclasses.replace(
        net,
        intra=dataclasses.replace(net.intra, alpha_s=net.intra.alpha_s / 1e3),
        inter=dataclasses.replace(net.inter, alpha_s=net.inter.alpha_s / 1e3),
    )
    wrong = Auto(network=fast)
    failures, slow_calls = [], []
    run = comm.executor.run

    def maybe_slow(*a, **k):
        if slow_calls:
            time.sleep(0.05)  # a slow rank in the watch phase: only the max over ranks decides
        return run(*a, **k)

    comm.executor.run = maybe_slow
    key = (wrong, p, 4 * N)
    for i in range(MAX_CALLS):
        if i > 6 and comm.slots.auto_tuning[key].phase == "settled":
            break
        x = torch.full((N,), float(rank + 1))
        t = comm.slots.auto_tuning.get(key)  # the baseline's timed calls 1 to 3 (after a hold)
        slow = t is not None and t.phase == "baseline" and 1 <= t.calls <= 3
        slow_calls[:] = [i] if rank == 1 and slow else []
        commrt.all_reduce(x, comm, algorithm=wrong, op="sum")
        if not torch.equal(x, torch.full((N,), p * (p + 1) / 2)):
            failures.append({"call": i, "got": x[:3].tolist()})
    slow_calls.clear()
    y = torch.ones(N)
    commrt.all_reduce(y, comm, algorithm=loaded, op="sum")
    t = comm.slots.auto_tuning[key]  # learning() and choices() show the
    c = comm.slots.auto_choices[key]  # last Auto per size: here, `loaded`
    assert learning(comm)[4 * N] is comm.slots.auto_tuning[(loaded, p, 4 * N)]
    assert choices(comm)[4 * N].network == net
    mine = {
        "rank": rank,
        "tuning": [t.phase, t.choice, t.runner_up, t.kept, t.chosen_s, t.runner_s, t.trial_s],
        "choice": [c.label, c.learned],
        "loaded_probe": dataclasses.asdict(comm.slots.probe) | {"seconds": 0},
        "saved_probe": pr.to_dict() | {"seconds": 0},
        "failures": failures + ([] if torch.equal(y, torch.full((N,), float(p))) else ["y"]),
    }
    write_ranks(world, comm, out_path, mine)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
