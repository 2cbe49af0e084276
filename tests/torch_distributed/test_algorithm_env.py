"""COMMRT_ALGORITHM is checked when the group is made, and the error names the variable."""

import pytest
import torch.distributed as dist

import commrt  # noqa: F401  (registers the backend)
from commrt.distributed import Options


def _init(tmp_path, **kwargs):
    dist.init_process_group(
        "commrt", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, **kwargs
    )
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "family, way", [("gossip", "gossip_hook"), ("backup", "GradientSync"), ("Gossip", "hook")]
)
def test_not_an_all_reduce_is_refused_at_init_with_the_way_to_get_it(
    family, way, tmp_path, monkeypatch
):
    monkeypatch.setenv("COMMRT_ALGORITHM", family)
    with pytest.raises(ValueError, match="COMMRT_ALGORITHM") as caught:
        _init(tmp_path)
    assert way in str(caught.value) and "GradientSync" in str(caught.value)


def test_an_unknown_name_is_named_with_the_variable_and_the_choices(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRT_ALGORITHM", "torus")
    with pytest.raises(ValueError, match="COMMRT_ALGORITHM='torus'") as caught:
        _init(tmp_path)
    assert "torus2d" in str(caught.value) and "gossip" not in str(caught.value)


def test_a_misspelt_name_gets_the_near_one(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRT_ALGORITHM", "rign")
    with pytest.raises(ValueError, match="did you mean 'ring'"):
        _init(tmp_path)


def test_pg_options_instance_of_gossip_is_refused(tmp_path):
    from commrt.algorithms import Gossip

    with pytest.raises(ValueError, match="pg_options"):
        _init(tmp_path, pg_options=Options(algorithm=Gossip()))


def test_a_valid_name_still_makes_the_group(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRT_ALGORITHM", "torus2d")
    _init(tmp_path)


def test_abort_advice_fits_how_the_group_was_made(monkeypatch):
    """The backend's groups (made by init_process_group) are never told to call commrt.init."""
    import sys

    from commrt.diagnosis import abort

    said = []
    monkeypatch.setattr(abort, "end_job", said.append)  # where the hook calls it
    monkeypatch.setattr(sys, "excepthook", lambda *exc: None)

    farewells = []

    class Departures:  # the communicator's: the hook leaves a failed farewell there
        def announce(self, how, cause):
            farewells.append((how, cause))

    class Comm:
        rank, closed, stall = 1, False, None  # no stall watch: the hook's plain exit
        departures = Departures()

    backend_comm = Comm()
    abort.install_abort_hook(backend_comm)  # as the backend's devices install it
    sys.excepthook(RuntimeError, RuntimeError("peer gone"), None)
    assert "COMMRT_ABORT_ON_ERROR=0" in said[-1] and "commrt.init" not in said[-1]
    # an error not commrt's names no peer: this rank is its own cause, and says so
    assert len(farewells) == 1 and farewells[0][1] == backend_comm.rank
