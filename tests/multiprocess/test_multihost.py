"""commrt across hosts for real: ranks in network namespaces joined by 1 Gbit/s links.

tools/netns.py builds the hosts (a bridge, one tbf-shaped veth per host;
``netem`` is not available in this kernel, so links differ in bandwidth
only) and starts 2 ranks per host with torchrun's variables over gloo;
tests/workers/multihost_worker.py is each rank. Skipped with the reason
where namespaces cannot be made (not root, no ip/tc). How ``auto``'s choice there
compares with every candidate, timed, is a benchmark: bench/bench_sim_calibration.py.
"""

import json
import os
import sys

import pytest
from helpers.mp import TESTS

from commrt.sim import Overhead

pytestmark = pytest.mark.netns

WORKER = os.path.join(TESTS, "workers", "multihost_worker.py")
RANKS_PER_HOST = 2
GBIT_BYTES_PER_S = 1e9 / 8
FP32_TOL = 1e-5  # GradientSync vs DDP, as in tests/multiprocess/test_gradsync.py


def run(netns_cluster, hosts, tmp_path):
    cluster = netns_cluster(hosts, rate="1gbit")
    argv = [sys.executable, WORKER, str(tmp_path)]
    cluster.launch(RANKS_PER_HOST, argv, timeout=300)
    return [
        json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(hosts * RANKS_PER_HOST)
    ]


def off_host_formula(alg, rank, hosts, L, nbytes):
    """Bytes a rank sends to other hosts in one all-reduce of ``nbytes`` (blocks of L per host).

    ring: only the last rank of a host has its successor elsewhere; it sends
    all its 2(p-1) chunks of n/p there. torus2d with one row per host: the
    rows stay inside a host; every rank sends its 2(hosts-1) column chunks
    of n/p to other hosts.
    """
    p = hosts * L
    if alg == "ring":
        return 2 * (p - 1) * nbytes // p if rank % L == L - 1 else 0
    return 2 * (hosts - 1) * nbytes // p


@pytest.mark.parametrize("hosts", [2, 4])
@pytest.mark.slow
def test_all_reduce_gradsync_and_bytes_across_hosts(netns_cluster, hosts, tmp_path):
    reports = run(netns_cluster, hosts, tmp_path)
    p, L = hosts * RANKS_PER_HOST, RANKS_PER_HOST
    for r in reports:
        # commrt.init took node-local rank and size from the launch; default torus: a row per host
        launch = (r["world_size"], r["backend"], r["local_size"], r["local_rank"])
        assert launch == (p, "gloo", L, r["rank"] % L) and r["ranks_per_node"] == L
        assert r["hosts"] == [q // L for q in range(p)] and r["host"] == r["rank"] // L
        assert r["torus_shape"] == [hosts, L]
        assert r["torus_schedule"] == 2 * (hosts - 1) + 2 * (L - 1)  # steps
        # ring, halving_doubling, torus2d and auto equal the float64 reference (1 to 100 003 floats)
        assert r["failures"] == []
        # GradientSync = DDP after 10 fp32 steps, and the same parameters on every rank
        for alg, g in r["gradsync"].items():
            assert g["rel_err"] <= FP32_TOL and g["buckets"] >= 3, (alg, g)
            assert g["digest"] == reports[0]["gradsync"][alg]["digest"], alg
        # bytes to other hosts, counted per peer by the transport wrapper, match the formulas
        n = r["numel"] * 4
        for alg in ("ring", "torus2d"):
            want = off_host_formula(alg, r["rank"], hosts, L, n)
            assert r["bytes"][alg]["off_host"] == want, (alg, r)
            assert sum(r["bytes"][alg].values()) == 2 * (p - 1) * n // p  # same total as the ring
    total = {alg: sum(r["bytes"][alg]["off_host"] for r in reports) for alg in ("ring", "torus2d")}
    assert total["torus2d"] == 2 * (hosts - 1) * n < total["ring"] == hosts * 2 * (p - 1) * n // p
    # per host: the torus's L ranks share 2(hosts-1)/hosts·n, the ring's one rank sends 2(p-1)/p·n
    assert max(r["bytes"]["torus2d"]["off_host"] for r in reports) * L < 2 * (p - 1) * n // p

    # the probe found both link classes: 1 Gbit/s between hosts (one NIC each), faster inside a host
    pr = reports[0]["probe"]
    assert (pr["ranks_per_node"], pr["nics_per_node"]) == (L, 1), pr
    inter_bw = 1 / pr["inter_beta_s_per_byte"]
    assert 0.3 * GBIT_BYTES_PER_S < inter_bw < 1.1 * GBIT_BYTES_PER_S, pr
    # the NIC is the slower tier, or the probe said it could not tell them apart after
    # measuring twice (a ProbeWarning; both tiers priced at the slower β)
    assert pr["inter_beta_s_per_byte"] > pr["beta_s_per_byte"] or pr["warnings"], pr

    def agreed(probe):  # all but this rank's own wall time
        return {k: v for k, v in probe.items() if k != "seconds"}

    assert all(agreed(r["probe"]) == agreed(pr) for r in reports)  # every rank prices alike
    # across hosts on CPU it timed each kind of step (commrt.tuning.probe_steps), and prices with them
    assert all(isinstance(pr[k], float) and pr[k] > 0 for k in ("shift_s", "exchange_s")), pr
    assert reports[0]["overhead"] == repr(Overhead(pr["shift_s"], pr["exchange_s"], pr["multi_s"]))
    # and every rank's model makes the same choice from the same prices: its cheapest
    # (how that choice compares with the others, timed: bench/bench_sim_calibration.py)
    for size, m in reports[0]["model"].items():
        assert m["choice"] == min(m["predicted"], key=m["predicted"].get), (size, m)
        assert all(r["model"][size] == m for r in reports), size


def test_harness_says_why_it_cannot_run(monkeypatch):
    import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(netns.Unavailable, match="need root"):
        netns.Cluster(2)
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        netns.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/ip"
    )
    with pytest.raises(netns.Unavailable, match="'tc' not found: install iproute2"):
        netns.Cluster(2)
