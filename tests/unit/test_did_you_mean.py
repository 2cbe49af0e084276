"""A misspelt name gets the closest one back, in the library as on the command line:
algorithm and backend names, and the keyword arguments of what users call."""

from __future__ import annotations

import inspect

import pytest

import commrt
from commrt.algorithms import BackupWorkers, Gossip, Ring, Torus2D, resolve
from commrt.distributed import Options
from commrt.errors import named_keywords


@pytest.mark.parametrize(
    "call, hint",
    [
        (lambda: resolve("rign"), "did you mean 'ring'?"),
        (lambda: resolve("gosip"), "did you mean 'gossip'?"),
        (lambda: commrt.init("glo"), "did you mean 'gloo'?"),
    ],
)
def test_an_unknown_algorithm_or_backend_name_suggests_the_closest(call, hint):
    with pytest.raises(ValueError, match=hint):
        call()


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda: commrt.init(timout=3), "init() got an unexpected keyword argument 'timout'; "
         "did you mean 'timeout'?"),
        (lambda: commrt.GradientSync(None, None, bucketmb=4), "GradientSync() got an "
         "unexpected keyword argument 'bucketmb'; did you mean 'bucket_mb'?"),
        (lambda: Gossip(deadline=0.05), "did you mean 'deadline_s'?"),
        (lambda: BackupWorkers(backup=1), "did you mean 'backups'?"),
        (lambda: Torus2D(row=2), "did you mean 'rows'?"),
        (lambda: Options(eager_pair=3), "did you mean 'eager_pairs'?"),
    ],
)  # fmt: skip
def test_a_misspelt_keyword_suggests_the_closest_without_a_chain(call, said):
    with pytest.raises(TypeError) as got:
        call()
    assert said in str(got.value), got.value
    assert got.value.__cause__ is None and got.value.__suppress_context__


def test_a_keyword_nothing_is_close_to_says_so_plainly_and_errors_inside_stay_as_they_are():
    with pytest.raises(TypeError, match=r"^Ring\(\) got an unexpected keyword argument 'x'$"):
        Ring(x=1)

    @named_keywords
    def inner(a=1):
        raise TypeError("raised inside")

    with pytest.raises(TypeError, match="^raised inside$"):
        inner(a=2)


def test_the_signatures_users_read_are_the_originals():
    assert "timeout" in inspect.signature(commrt.init).parameters
    assert "deadline_s" in inspect.signature(Gossip).parameters
    assert Gossip(deadline_s=0.05) == Gossip(deadline_s=0.05)  # still a dataclass
