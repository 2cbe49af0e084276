"""A local job listens on loopback only.

While ``commrt train --nproc 2`` runs, the launcher's control store, the
rendezvous store and gloo's own sockets must not listen on any interface
but loopback: anyone who reaches the machine could otherwise write keys
into the job's control plane (fake arrival tickets, heartbeats, final
marks). The test reads the listening sockets of the job's processes from
/proc (``/proc/net/tcp*`` matched by inode against ``/proc/<pid>/fd``).
"""

import ipaddress
import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp"), reason="reads listening sockets from Linux's /proc"
)

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _addr(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6} (32-bit words in host byte order) as text."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _listening() -> dict[int, str]:
    """inode -> "addr:port" for every listening TCP socket of this network namespace."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == LISTEN:
                host, port = f[1].split(":")
                out[int(f[9])] = f"{_addr(host)}:{int(port, 16)}"
    return out


def _tree(root: int) -> set[int]:
    """``root`` and its descendants."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, grew = {root}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in found} - found
        found |= more
        grew = bool(more)
    return found


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def _job_listeners(root: int) -> dict[int, set[str]]:
    """pid -> the addresses its listening sockets are bound to, over ``root``'s tree."""
    listening = _listening()
    out = {}
    for pid in _tree(root):
        addrs = {listening[i] for i in _socket_inodes(pid) if i in listening}
        if addrs:
            out[pid] = addrs
    return out


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.rsplit(":", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_serve_binds_the_address_it_is_given():
    from commrt.runtime.store import serve

    store = serve("127.0.0.1", 0, 5.0)
    mine = _job_listeners(os.getpid())[os.getpid()]
    assert f"127.0.0.1:{store.port}" in mine
    assert all(_loopback(a) for a in mine if a.endswith(f":{store.port}")), mine


def test_serve_falls_back_for_host_names():
    from commrt.runtime.store import serve

    # a name may mean 127.0.1.1 here and the real address on the other nodes: every interface
    store = serve(socket.gethostname(), 0, 5.0)
    mine = _job_listeners(os.getpid())[os.getpid()]
    assert any(a.endswith(f":{store.port}") for a in mine)


@pytest.mark.slow
def test_local_job_listens_on_loopback_only():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE", "GLOO_SOCKET_IFNAME")
    }
    cmd = [sys.executable, "-m", "commrt", "train", "--nproc", "2", "--backend", "gloo"]
    cmd += ["--algorithm", "backup", "--backups", "1", "--epochs", "3", "--quiet"]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, set[str]] = {}
    deadline = time.monotonic() + 240
    try:
        while job.poll() is None and time.monotonic() < deadline:
            for pid, addrs in _job_listeners(job.pid).items():
                seen.setdefault(pid, set()).update(addrs)
            time.sleep(0.1)
    finally:
        if job.poll() is None:
            job.kill()
        out, err = job.communicate()
    assert job.returncode == 0, err[-2000:]
    # the launcher's store and the two ranks' gloo listeners were seen while it ran
    assert job.pid in seen, (seen, err[-2000:])
    assert len(seen) >= 2, seen
    wide = {pid: sorted(a for a in addrs if not _loopback(a)) for pid, addrs in seen.items()}
    assert not any(wide.values()), f"listening beyond loopback: {wide}"
