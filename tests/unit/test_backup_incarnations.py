"""Which incarnation of a rank is dead, as a backup worker's heartbeat thread reads the log.

A rank whose thread read a death and the replacement's return in one beat never sees the
rank in ``missing``; a round the dead incarnation took a ticket in must still end at once,
or that rank sits out the timeout while the others redo the step without it, and their
redo times out. The log is a real store; no process, no clock.
"""

from types import SimpleNamespace

import pytest
from torch.distributed import HashStore

from commrt.sync.backup.keys import Keys
from commrt.sync.backup.liveness import Liveness
from commrt.sync.backup.recovery import REDO, Reduction
from commrt.sync.backup.rejoin import announce


def liveness(store, rank=2):
    return Liveness(None, "", store, rank, 4, dead_after_s=2.0, timeout=60.0)


def died(store, rank, checker):
    """``checker``'s heartbeat thread finds ``rank``'s current incarnation silent."""
    watcher = liveness(store, rank=checker)
    watcher.refresh(store)  # it has read any return of a replacement logged so far
    watcher.declare_dead(store, rank)


def came_back(store, rank, incarnation):
    announce(store, rank, incarnation, world_size=4)


def test_a_death_and_a_return_read_in_one_beat_leave_the_old_incarnation_dead():
    store = HashStore()
    live = liveness(store)
    died(store, 1, 0)
    came_back(store, 1, 1)
    live.refresh(store)
    assert live.missing == frozenset() and live.incarnations == {1: 1}
    assert live.recorded_dead("1")  # the ticket the killed process took
    assert not live.recorded_dead("1.1") and not live.recorded_dead("0")


def test_a_replacement_is_alive_before_its_return_is_read_and_dead_once_its_own_death_is():
    store = HashStore()
    live = liveness(store)
    died(store, 1, 0)
    live.refresh(store)  # the death only: the return is not logged yet
    assert live.missing == {1} and live.recorded_dead("1")
    assert not live.recorded_dead("1.1")  # its replacement's ticket: not given up early
    came_back(store, 1, 1)
    live.refresh(store)
    assert live.missing == frozenset() and not live.recorded_dead("1.1")
    died(store, 1, 3)
    live.refresh(store)
    assert live.missing == {1} and live.recorded_dead("1.1") and live.recorded_dead("1")


def reduction(store, live):
    traits = SimpleNamespace(survives_peer_death=True)  # gloo's: a failed step is redone
    ctx = SimpleNamespace(comm=SimpleNamespace(transport=SimpleNamespace(traits=traits)))
    ctx.buffers = []
    arrival = SimpleNamespace(store=store, rank=live.rank, p=4, n=3)
    return Reduction(ctx, None, "", arrival, live, inner=[], timeout=60.0)


def test_a_late_rank_redoes_at_once_a_step_whose_participant_died_and_came_back():
    """Rank 2 is late at step 10, whose participants include rank 1's killed process; it
    read the death and the return in one beat. Its wait for the step's outcome ends at
    once with a redo, before one idle turn."""
    store = HashStore()
    live = liveness(store)
    died(store, 1, 0)
    came_back(store, 1, 1)
    live.refresh(store)
    red = reduction(store, live)
    red.begin(10, (0, 1, 3), participant=False, names=("0", "1", "3"))

    def idle():
        pytest.fail("waited for the outcome of a step a dead incarnation took part in")

    assert red._outcome(idle) == REDO
    assert store.get(Keys.outcome(10, 0)).decode() == REDO


def test_a_round_with_the_replacement_is_waited_for_by_a_rank_that_has_not_read_its_return():
    """The converse: the replacement's ticket is no death, so the wait goes on (idle runs)."""
    store = HashStore()
    live = liveness(store)
    died(store, 1, 0)
    live.refresh(store)
    red = reduction(store, live)
    red.begin(11, (0, 1, 3), participant=False, names=("0", "1.1", "3"))
    turns = []

    def idle():
        turns.append(1)
        if len(turns) == 3:
            store.set(Keys.outcome(11, 0), "commit")  # the participants commit meanwhile

    assert red._outcome(idle) == "commit" and len(turns) == 3
