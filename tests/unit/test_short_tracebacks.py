"""How an error leaves a public call (commrt.errors.api_boundary): without commrt's frames
and the chain under commrt's own error, keeping the user's own error that it came during;
as raised under COMMRT_TRACEBACK=full. Code "in commrt" here is compiled under a file name
inside the package, so that its frames are commrt's as the real runtime's are."""

import os
import traceback

import pytest

import commrt
from commrt import settings
from commrt.errors import SHORTENED, CommError, api_boundary

INNER = os.path.join(os.path.dirname(os.path.abspath(commrt.__file__)), "runtime", "pretend.py")
CODE = """
def transport():
    raise ConnectionResetError("socket closed")

def executor():
    try:
        transport()
    except ConnectionResetError as e:
        raise CommError("commrt: rank 1 is gone") from e

class Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        executor()
"""
SPACE = {"CommError": CommError}
exec(compile(CODE, INNER, "exec"), SPACE)


@api_boundary
def public(inner, *args):
    return inner(*args)


def _shown(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


@pytest.fixture(autouse=True)
def _short(monkeypatch):
    monkeypatch.delenv(settings.TRACEBACK.name, raising=False)


def test_the_user_sees_their_frames_and_commrts_message_without_the_chain():
    with pytest.raises(CommError) as caught:
        public(SPACE["executor"])
    shown = _shown(caught.value)
    assert INNER not in shown and "ConnectionResetError" not in shown, shown
    assert __file__ in shown and "commrt: rank 1 is gone" in shown, shown
    assert shown.rstrip().endswith(SHORTENED), shown
    # the wrapper's own frame is commrt's too
    assert "in boundary" not in shown, shown


def test_the_users_own_error_that_commrts_came_during_stays():
    def users():
        with SPACE["Closing"]():
            raise KeyError("the user's")

    with pytest.raises(CommError) as caught:
        public(users)
    shown = _shown(caught.value)
    assert 'KeyError: "the user\'s"' in shown and "ConnectionResetError" not in shown, shown
    assert "During handling of the above exception" in shown, shown


def test_nested_public_calls_say_it_once():
    with pytest.raises(CommError) as caught:
        public(public, SPACE["executor"])
    assert _shown(caught.value).count(SHORTENED) == 1


def test_full_shows_the_error_as_raised(monkeypatch):
    monkeypatch.setenv(settings.TRACEBACK.name, "full")
    with pytest.raises(CommError) as caught:
        public(SPACE["executor"])
    shown = _shown(caught.value)
    assert INNER in shown and "ConnectionResetError: socket closed" in shown, shown
    assert SHORTENED not in shown


def test_a_value_neither_short_nor_full_is_named_and_shows_all(monkeypatch):
    monkeypatch.setenv(settings.TRACEBACK.name, "ful")
    with pytest.raises(CommError) as caught:
        public(SPACE["executor"])
    shown = _shown(caught.value)
    assert INNER in shown and f"{settings.TRACEBACK.name}='ful' is none of short, full" in shown, (
        shown
    )


def test_an_error_with_no_commrt_frame_is_left_as_it_is():
    def users():
        raise ValueError("mine")

    with pytest.raises(ValueError) as caught:
        public(users)
    assert SHORTENED not in _shown(caught.value) and "in users" in _shown(caught.value)
