"""A ``COMMRT_*`` variable that is nearly a setting (a typo) is named with the setting it
was probably meant to be, by rank 0, when the job starts; a test harness's own variables,
far from every setting, are left alone."""

import socket
import warnings

import pytest

import commrt
from commrt import settings


def test_a_near_miss_is_found_and_far_names_are_not():
    env = {
        "COMMRT_ALGORITM": "ring",
        "COMMRT_STALL_SS": "5",
        "COMMRT_ALGORITHM": "ring",  # declared: fine
        "COMMRT_TEST_LOGS": "/tmp/x",  # a harness's own: far from every setting
        "COMMRT_CONFORMANCE_GATES": "1",
        "NOT_COMMRT_ALGORITM": "1",
    }
    assert settings.misspelt(env) == [
        ("COMMRT_ALGORITM", "COMMRT_ALGORITHM"),
        ("COMMRT_STALL_SS", "COMMRT_STALL_S"),
    ]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_init_warns_of_a_typo_on_rank_0(monkeypatch):
    monkeypatch.setenv("COMMRT_ALGORITM", "ring")
    with pytest.warns(RuntimeWarning, match="COMMRT_ALGORITM is not a commrt setting.*"
                      "did you mean COMMRT_ALGORITHM"):  # fmt: skip
        comm = commrt.init("gloo", rank=0, world_size=1, master_addr="127.0.0.1",
                           master_port=_port(), stall_s=0)  # fmt: skip
    comm.close()


def test_without_a_typo_init_says_nothing(monkeypatch):
    monkeypatch.delenv("COMMRT_ALGORITM", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comm = commrt.init("gloo", rank=0, world_size=1, master_addr="127.0.0.1",
                           master_port=_port(), stall_s=0)  # fmt: skip
    comm.close()
