"""Several hosts on one machine: Linux network namespaces behind a rate-limited switch.

:class:`Cluster` makes H "hosts" (network namespaces, each with one
interface ``eth0`` at ``10.77.0.<h+1>/24``) and one more namespace holding
a Linux bridge, the "switch". Host h's ``eth0`` is one end of a veth pair
whose other end is a port of that bridge. A ``tbf`` qdisc shapes both
directions of each host's link (on ``eth0`` for what the host sends, on the
bridge port for what it receives), so every host gets one full-duplex NIC
of ``rate`` into a non-blocking switch, like a rack of servers.

Why a bridge rather than a star or mesh of veth pairs: each host then has
exactly one interface and one address, which is what ``GLOO_SOCKET_IFNAME``
names, and no routing is needed; a mesh would give every host H-1
interfaces and per-pair routes. Ranks inside one namespace reach each
other's address over that namespace's loopback, never through the veth,
so same-host traffic is not shaped (the fast tier) and different-host
traffic is (the slow tier).

``netem`` (added latency, loss) is **not** available in this machine's
kernel ("Specified qdisc kind is unknown"); only ``tbf`` shapes the links,
so the slow tier differs in bandwidth, not in latency.

Isolation: every interface is created inside the namespaces this module
made (none in the caller's namespace), all traffic stays on the private
test subnet inside them, and the namespace names carry this process's pid
and a counter, so parallel runs never clash. :meth:`Cluster.close` (also on
any error, and from the pytest fixture's teardown) kills the ranks it
started and deletes the namespaces, which deletes their links. (A run
killed with SIGKILL leaves empty namespaces behind; ``ip netns list``
shows them as ``cmrt<pid>x<n>…`` and ``ip netns del`` removes them. They
are not removed automatically, since a pid this process cannot see may
belong to a live run in another pid namespace.)

Ranks get the environment torchrun gives them: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the host), MASTER_ADDR (host 0's
address), MASTER_PORT, plus GLOO_SOCKET_IFNAME=eth0.

Example::

    with Cluster(hosts=2, rate="1gbit") as c:
        results = c.launch(2, [sys.executable, "worker.py"], timeout=120)

Command line (for benchmarks; needs root)::

    python tools/netns.py --hosts 4 --ranks-per-host 2 --rate 1gbit -- \\
        python bench/bench_sim_calibration.py --sizes 16M,64M
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

SUBNET = "10.77.0"  # private test subnet; it exists only inside our namespaces
IFNAME = "eth0"
MASTER_PORT = 29500
_PREFIX = "cmrt"
_counter = itertools.count()


class Unavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why (tests skip with it)."""


def _ip(*args: str, timeout: float = 10.0) -> str:
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if the basic checks pass."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run the tests as root to include them"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found: install iproute2 (apt-get install iproute2)"
    return None


@dataclass
class RankResult:
    rank: int
    host: int
    returncode: int
    stdout: str
    stderr: str


class Cluster:
    """H hosts (namespaces) on a bridge, links shaped to ``rate`` (a tc rate: "1gbit").

    Raises :class:`Unavailable` if the namespaces cannot be built. Use as a
    context manager, or call :meth:`close`.
    """

    def __init__(
        self, hosts: int, rate: str | None = "1gbit", burst: str = "256kb", latency: str = "50ms"
    ):
        if hosts < 1 or hosts > 200:
            raise ValueError(f"hosts must be between 1 and 200, got {hosts}")
        reason = unavailable_reason()
        if reason:
            raise Unavailable(reason)
        tag = f"{_PREFIX}{os.getpid()}x{next(_counter)}"
        self.switch = f"{tag}sw"
        self.namespaces = [f"{tag}h{h}" for h in range(hosts)]
        self.addresses = [f"{SUBNET}.{h + 1}" for h in range(hosts)]
        self.rate = rate
        self._made: list[str] = []
        self._procs: list[subprocess.Popen] = []
        try:
            self._build(rate, burst, latency)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            self.close()
            raise Unavailable(f"could not build the test namespaces: {e}") from None

    @property
    def hosts(self) -> int:
        return len(self.namespaces)

    def _build(self, rate, burst, latency) -> None:
        sw = self.switch
        _ip("ip", "netns", "add", sw)
        self._made.append(sw)
        _ip("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("ip", "-n", sw, "link", "set", "br0", "up")
        for h, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
            _ip("ip", "netns", "add", ns)
            self._made.append(ns)
            port = f"p{h}"
            # Both ends are born inside our namespaces: nothing appears in the caller's.
            _ip(
                "ip",
                "-n",
                sw,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                IFNAME,
                "netns",
                ns,
            )
            _ip("ip", "-n", sw, "link", "set", port, "master", "br0")
            _ip("ip", "-n", sw, "link", "set", port, "up")
            _ip("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME)
            _ip("ip", "-n", ns, "link", "set", IFNAME, "up")
            _ip("ip", "-n", ns, "link", "set", "lo", "up")
            if rate:
                for where, dev in ((ns, IFNAME), (sw, port)):
                    _ip(
                        "tc",
                        "-n",
                        where,
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        rate,
                        "burst",
                        burst,
                        "latency",
                        latency,
                    )

    def env(self, rank: int, host: int, local_rank: int, ranks_per_host: int) -> dict:
        """torchrun's variables for one rank, plus GLOO_SOCKET_IFNAME."""
        world = self.hosts * ranks_per_host
        return dict(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(ranks_per_host),
            GROUP_RANK=str(host),
            MASTER_ADDR=self.addresses[0],
            MASTER_PORT=str(MASTER_PORT),
            GLOO_SOCKET_IFNAME=IFNAME,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )

    def launch(
        self,
        ranks_per_host: int,
        argv: list[str],
        *,
        timeout: float = 300,
        env: dict | None = None,
        check: bool = True,
    ) -> list[RankResult]:
        """Run ``argv`` as ``ranks_per_host`` ranks in every host, ranks in blocks per host.

        Returns every rank's exit status and output. ``check``: raise
        AssertionError (with the failing ranks' output) unless all exit 0.
        After ``timeout`` seconds every rank still running is killed.
        """
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be positive, got {ranks_per_host}")
        logs = tempfile.mkdtemp(prefix="commrt-netns-")
        runs = []
        try:
            for h, ns in enumerate(self.namespaces):
                for lr in range(ranks_per_host):
                    rank = h * ranks_per_host + lr
                    e = dict(os.environ, **(env or {}), **self.env(rank, h, lr, ranks_per_host))
                    out = open(os.path.join(logs, f"{rank}.out"), "w+")
                    err = open(os.path.join(logs, f"{rank}.err"), "w+")
                    p = subprocess.Popen(
                        ["ip", "netns", "exec", ns, *argv],
                        env=e,
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                    self._procs.append(p)
                    runs.append((rank, h, p, out, err))
            deadline = time.monotonic() + timeout
            for _, _, p, _, _ in runs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            self._kill()
            results = []
            for rank, h, p, out, err in runs:
                out.seek(0)
                err.seek(0)
                rc = p.returncode if p.returncode is not None else -signal.SIGKILL
                results.append(RankResult(rank, h, rc, out.read(), err.read()))
        finally:
            for _, _, _, out, err in runs:
                out.close()
                err.close()
            shutil.rmtree(logs, ignore_errors=True)
        if check and any(r.returncode != 0 for r in results):
            timed_out = time.monotonic() >= deadline
            bad = [r for r in results if r.returncode != 0]
            text = "\n".join(
                f"--- rank {r.rank} (host {r.host}) exit {r.returncode}\n"
                f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
                for r in bad[:3]
            )
            killed = f" (killed after {timeout} s)" if timed_out else ""
            raise AssertionError(
                f"{len(bad)} of {len(results)} ranks failed{killed}: {argv}\n{text}"
            )
        return results

    def _kill(self) -> None:
        # Only processes this object started (each leads its own session).
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        self._procs = [p for p in self._procs if p.poll() is None]

    def close(self) -> None:
        """Kill our ranks still running, delete our namespaces (and so their links). Idempotent."""
        self._kill()
        for ns in reversed(self._made):
            try:
                _ip("ip", "netns", "del", ns)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        self._made = []

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run a command as ranks on namespace hosts (root).")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--rate", default="1gbit", help="tbf rate of each host's link, or 'none'")
    ap.add_argument("--burst", default="256kb", help="tbf bucket size (default 256kb)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command each rank runs")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command after --")
    if cmd[0] == "python":
        cmd[0] = sys.executable
    rate = None if args.rate == "none" else args.rate
    with Cluster(args.hosts, rate=rate, burst=args.burst) as c:
        results = c.launch(args.ranks_per_host, cmd, timeout=args.timeout, check=False)
    for r in results:
        if r.rank == 0 or r.returncode != 0:
            sys.stdout.write(r.stdout)
            sys.stderr.write(r.stderr if r.returncode != 0 else "")
    return max((abs(r.returncode) for r in results), default=0)


if __name__ == "__main__":
    sys.exit(main())
