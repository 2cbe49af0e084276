"""Which transport ran, and why, is visible outside DDP: in ``print(sync.stats)``, which
also says whose stats they are (every rank prints its own block), and in the info log of
``commrt.init`` (``COMMRT_LOG=info``)."""

import torch

import commrt
from commrt.sync.stats import per_bucket


def test_a_communicator_says_its_transport_and_why(monkeypatch):
    monkeypatch.delenv("COMMRT_LOG", raising=False)
    with commrt.init("gloo", rank=0, world_size=1) as comm:
        assert comm.transport_text == "gloo (asked for)"
    with commrt.init("auto", rank=0, world_size=1) as comm:  # one rank: gloo, as auto's last
        assert comm.transport_text == "gloo (auto: where no transport above it fits)"


def test_the_info_log_names_the_transport_init_chose(monkeypatch, capfd):
    monkeypatch.setenv("COMMRT_LOG", "info")
    with commrt.init("auto", rank=0, world_size=1):
        pass
    err = capfd.readouterr().err  # one write to the process's stderr (abort.say)
    assert "commrt: rank 0 of 1: transport gloo (auto: " in err, err
    monkeypatch.setenv("COMMRT_LOG", "off")
    with commrt.init("auto", rank=0, world_size=1):
        pass
    assert "transport" not in capfd.readouterr().err


def test_sync_stats_are_labelled_with_the_rank_and_name_the_transport(monkeypatch):
    monkeypatch.delenv("COMMRT_LOG", raising=False)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with commrt.init("gloo", rank=0, world_size=1) as comm:
        sync = commrt.GradientSync(model, comm, algorithm="ring", bucket_mb=1e-4)
        model(torch.randn(3, 4)).sum().backward()
        sync.wait()
        lines = str(sync.stats).splitlines()
        sync.close()
    assert lines[0] == "rank 0 of 1, transport gloo (asked for)", lines
    per = [line for line in lines if line.startswith("algorithm per bucket ")]
    assert per == ["algorithm per bucket  ring (1 bucket)"], lines


def test_the_algorithm_per_bucket_is_said_compactly():
    assert per_bucket(("ring",) * 3) == "ring (3 buckets)"
    assert per_bucket(("ring",)) == "ring (1 bucket)"
    assert per_bucket(("ring", "ring", "torus2d")) == "ring (buckets 0-1), torus2d (bucket 2)"
    assert per_bucket(()) == "none (no buckets)"
