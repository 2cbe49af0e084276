"""The end of an MPI worker: every rank's result to rank 0, which writes them all."""

import json


def write_ranks(world, comm, out_path: str, mine: dict) -> None:
    """Gather each rank's ``mine`` to rank 0 (over mpi4py's ``world``), close ``comm``, and
    on rank 0 write ``{"world_size": p, "ranks": [...]}`` to ``out_path`` (collective)."""
    everyone = world.gather(mine, root=0)
    comm.close()
    if world.Get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"world_size": world.Get_size(), "ranks": everyone}, f, indent=1)
