"""The gloo/NCCL rendezvous store: where the ranks of a job first find each other.

Also :func:`serve`, the one way commrt hosts a TCPStore server (here, the
launcher's and the control store), so a job whose MASTER_ADDR is 127.0.0.1
listens on loopback only. A leaf: :mod:`commrt.runtime.communicator` and :mod:`commrt.runtime.store`
import it, and it imports neither back. And :func:`check_timeout`, the one
check of a timeout a user gives (``commrt.init``, ``commrt train --timeout``).
"""

from __future__ import annotations

import datetime
import numbers
import os
import re
import time

from commrt import settings
from commrt.errors import RendezvousTimeoutError

MAX_TIMEOUT_S = settings.Seconds(
    1e8,
    "the longest timeout commrt takes (about 3 years): longer ones overflow torch's store, "
    "`timedelta` or a thread's wait",
    "every timeout given",
    settings.TIMEOUT,
)
DEFAULT_TIMEOUT_S = settings.Seconds(
    300.0,
    "the timeout of every wait where none is given",
    "`commrt.init`, `--timeout`, a process group made without one (torch itself passes its own "
    "default, 30 min)",
    settings.TIMEOUT,
)


def check_timeout(timeout, what: str = "timeout") -> float:
    """``timeout`` as float seconds: a real number (not a bool or a string) above 0 and at
    most :data:`MAX_TIMEOUT_S`; else a one-line TypeError or ValueError naming ``what``."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= MAX_TIMEOUT_S:  # nan fails this too
        raise ValueError(
            f"{what} must be a positive number of seconds, at most {MAX_TIMEOUT_S:g} "
            f"(about 3 years), got {timeout!r}"
        )
    return float(timeout)


def tcp_store(
    launch,
    rank: int,
    world_size: int,
    master_addr: str | None,
    master_port: int | None,
    timeout: float,
):
    """A TCPStore for gloo/NCCL rendezvous, wrapped in a commrt prefix.

    ``launch`` is the :class:`commrt.process.environment.LaunchInfo`. Port 0 under mpiexec:
    rank 0 lets the OS pick a free port and tells the others over MPI, so
    ``mpiexec -n 4 ... backend="gloo"`` needs no set-up.
    """
    import torch.distributed as dist

    addr = master_addr or launch.master_addr or "127.0.0.1"
    port = master_port if master_port is not None else launch.master_port
    if world_size == 1:
        store = dist.HashStore()
    elif port is None and launch.launcher == "mpiexec":
        world = mpi_world()
        store = serve(addr, 0, timeout, world_size) if rank == 0 else None
        port = int(bcast_text(world, str(store.port) if rank == 0 else ""))
        addr = bcast_text(world, addr)
        if rank != 0:
            store = _meet(rank, addr, port, world_size, timeout, host=False)
    elif port is None:
        raise ValueError(
            "gloo/nccl rendezvous needs MASTER_ADDR and MASTER_PORT (torchrun sets "
            "them) or master_addr=/master_port= arguments"
        )
    else:
        # Under torchrun's elastic agent (or commrt's launcher) the store is hosted already.
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        store = _meet(rank, addr, port, world_size, timeout, host=rank == 0 and not agent)
    return dist.PrefixStore("commrt", store)


def _meet(rank: int, addr: str, port: int, world_size: int, timeout: float, host: bool):
    """The rendezvous store: hosted here (``host``: it waits for every rank) or reached;
    its timeout a :class:`~commrt.errors.RendezvousTimeoutError` (torch's says only
    "1/2 clients joined", with a traceback)."""
    import torch.distributed as dist

    start = time.monotonic()
    try:
        if host:
            return serve(addr, port, timeout, world_size, wait_for_workers=True)
        return dist.TCPStore(
            addr, port, world_size, False, timeout=datetime.timedelta(seconds=timeout)
        )
    except dist.DistError as e:
        # the host's wait for the ranks fails as a DistStoreError; a rank's connecting
        # keeps trying for the whole timeout; anything else (a port taken) is not a timeout
        waited = time.monotonic() - start >= timeout
        if not (isinstance(e, dist.DistStoreError) if host else waited):
            raise
        count = re.search(r"(\d+)/\d+ clients joined", str(e)) if host else None
        raise RendezvousTimeoutError(
            rank=rank,
            timeout_s=timeout,
            address=f"{addr}:{port}",
            world_size=world_size,
            joined=int(count.group(1)) if count else None,
        ) from e


def serve(
    host: str,
    port: int,
    timeout: float,
    world_size: int | None = None,
    wait_for_workers: bool = False,
):
    """A TCPStore server for ``host:port`` that listens on ``host``'s address only.

    torch's TCPStore server listens on every interface whatever its host
    name, so anyone who reaches the machine could write keys into the job's
    control plane. Here, when ``host`` is an IP address (or ``localhost``),
    we bind and ``listen()`` on that address ourselves and hand the socket
    over (``master_listen_fd``): 127.0.0.1 for a local job, the private
    interface's address for MASTER_ADDR=10.0.0.1. A host *name* may resolve
    to a loopback address here and to the real one elsewhere (127.0.1.1 in
    /etc/hosts), and an address that is not this machine's cannot be bound:
    then it listens on every interface, as torch does.
    """
    import torch.distributed as dist

    sock = _bound(host, port)
    if sock is not None:
        port = sock.getsockname()[1]
    return dist.TCPStore(
        host,
        port,
        world_size,
        True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=wait_for_workers,
        # the store owns (and closes) the socket from here on
        **({"master_listen_fd": sock.detach()} if sock is not None else {}),
    )


def _bound(host: str, port: int):
    """A socket bound to ``host``'s IP address and listening, or None (see :func:`serve`)."""
    import ipaddress
    import socket

    try:
        ip = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        return None  # a host name: no way to tell which interface it means on every node
    sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((str(ip), port))
        sock.listen(socket.SOMAXCONN)
    except OSError:  # not an address of this machine (behind NAT, say): every interface
        sock.close()
        return None
    return sock


def mpi_world():
    """MPI's ``COMM_WORLD`` (MPI initialised on first use)."""
    from commrt.transports.mpi import load_mpi

    return load_mpi().COMM_WORLD


def bcast_text(world, text: str, size: int = 256) -> str:
    """Rank 0's ``text`` on every rank, as raw bytes (mpi4py's ``bcast`` would pickle)."""
    from commrt.transports.mpi import load_mpi

    buf = bytearray(size)
    if world.Get_rank() == 0:
        data = text.encode()
        if len(data) > size:
            raise ValueError(f"{text[:40]!r}…: longer than {size} bytes")
        buf[: len(data)] = data
    world.Bcast([buf, load_mpi().BYTE], root=0)
    return bytes(buf).rstrip(b"\0").decode()


def reachable_by_all(world, addressed: bool) -> bool:
    """Whether every rank can reach a store rank 0 hosts (agreed by all, over MPI): not
    when ranks span hosts and ``MASTER_ADDR`` is unset (``addressed`` False: the loopback
    address would be another machine's). Rank 0 then says once that the job runs without
    a stall watch (:mod:`commrt.diagnosis.stall`, which asks)."""
    import socket
    import sys

    import numpy as np

    from commrt.transports.mpi import load_mpi

    same_host = bcast_text(world, socket.gethostname()) == socket.gethostname()
    here = addressed or same_host
    ok = np.array([int(here)], dtype=np.int32)
    world.Allreduce(load_mpi().IN_PLACE, [ok, load_mpi().INT], op=load_mpi().MIN)
    if not ok[0] and world.Get_rank() == 0:
        print(
            "commrt: no stall watch: the ranks span hosts and MASTER_ADDR is unset; set it "
            "to rank 0's address for the verdict (see Stalls in commrt's documentation)",
            file=sys.stderr,
            flush=True,
        )
    return bool(ok[0])
