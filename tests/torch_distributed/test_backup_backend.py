"""Backup workers and the default backend: the mpich wheel ends every rank when one
dies, so ``commrt train --algorithm backup`` picks gloo on ``--backend auto`` (and says
so), and refuses ``--backend mpi`` with ``--kill``."""

import pytest
import torch

from commrt import settings
from commrt.cli import commands, main
from commrt.cli import launch as launcher
from commrt.transports import shm_connect

BACKUP = ["train", "--nproc", "4", "--algorithm", "backup", "--backups", "1"]


@pytest.fixture
def launched(monkeypatch):
    """Calls to the launcher, recorded instead of starting ranks; MPI looks installed, and
    shared memory unusable (auto's choice is then mpi), on a machine without a GPU."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "WORLD_SIZE", settings.LAUNCHED.name):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(commands, "_mpi_installed", lambda: True)
    monkeypatch.setattr(shm_connect, "unusable", lambda: "no /dev/shm here")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls = []

    def fake_launch(argv, nproc, **kw):
        calls.append((list(argv), nproc, kw))
        return 0

    monkeypatch.setattr(launcher, "launch", fake_launch)
    return calls


def test_auto_backend_runs_backup_workers_over_gloo(launched, capsys):
    assert main([*BACKUP, "--kill", "3:20"]) == 0
    out = capsys.readouterr().out
    assert "backup workers run over gloo, not mpi: only gloo carries on past a dead rank" in out
    assert "MPI ends every rank when one dies" in out
    assert "starting 4 ranks (gloo)" in out
    ((argv, nproc, kw),) = launched
    assert argv[-2:] == ["--backend", "gloo"] and nproc == 4
    assert kw["use_mpiexec"] is False and kw["tolerate"] == 1 and kw["host_store"] is True


def test_auto_backend_without_backups_keeps_mpi(launched, capsys):
    assert main(["train", "--nproc", "4", "--algorithm", "ring"]) == 0
    out = capsys.readouterr().out
    assert "over gloo" not in out and "starting 4 ranks (mpi)" in out
    assert launched[0][2]["use_mpiexec"] is True


def test_mpi_backend_with_kill_is_refused(launched, capsys):
    with pytest.raises(SystemExit) as e:
        main([*BACKUP, "--kill", "3:20", "--backend", "mpi"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "commrt train: error:" in err
    said = " ".join(err.split())  # the error is wrapped at 80 columns
    assert "MPI ends every rank when one dies" in said and "--backend gloo" in said, err
    assert not launched


def test_explicit_gloo_with_kill_is_accepted(launched, capsys):
    assert main([*BACKUP, "--kill", "3:20", "--backend", "gloo"]) == 0
    assert "over gloo:" not in capsys.readouterr().out  # asked for, nothing to explain
    assert launched[0][0][-2:] == ["--backend", "gloo"]


def test_auto_backend_runs_gossip_with_a_deadline_and_a_kill_over_gloo_and_says_so(
    launched, capsys
):
    gossip = ["train", "--nproc", "4", "--algorithm", "gossip", "--gossip-deadline", "auto"]
    assert main([*gossip, "--kill", "3:20"]) == 0
    out = capsys.readouterr().out
    assert "gossip with a deadline runs over gloo, not mpi: only gloo carries on" in out
    ((argv, nproc, kw),) = launched
    assert argv[-2:] == ["--backend", "gloo"] and kw["tolerate"] >= 1


@pytest.mark.parametrize("mpi", [False, True])
def test_auto_backend_runs_commrt_trains_own_ranks_through_shared_memory(
    launched, monkeypatch, capsys, mpi
):
    monkeypatch.setattr(commands, "_mpi_installed", lambda: mpi)
    monkeypatch.setattr(shm_connect, "unusable", lambda: None)
    assert main(["train", "--nproc", "2"]) == 0
    assert "starting 2 ranks (shm)" in capsys.readouterr().out
    assert launched[0][0][-2:] == ["--backend", "shm"]


def test_auto_backend_keeps_gloo_where_ranks_may_die(launched, monkeypatch, capsys):
    monkeypatch.setattr(shm_connect, "unusable", lambda: None)
    assert main([*BACKUP, "--kill", "3:20"]) == 0
    out = capsys.readouterr().out
    assert "starting 4 ranks (gloo)" in out and "over gloo, not shm" in out


def test_auto_backend_runs_a_job_with_restarts_over_gloo(launched, capsys):
    gossip = ["train", "--nproc", "4", "--algorithm", "gossip", "--gossip-deadline", "auto"]
    assert main([*gossip, "--max-restarts", "1"]) == 0
    out = capsys.readouterr().out
    assert "a job with --max-restarts runs over gloo, not mpi" in out
    assert launched[0][0][-2:] == ["--backend", "gloo"]


def test_ranks_a_launcher_started_leave_auto_to_init(launched, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert commands.auto_backend(2) == "auto"
    assert commands.auto_backend(2, ranks_may_die=True, who="backup workers run") == "gloo"
