"""The control plane: a small key-value store every rank reaches (torch's ``TCPStore``).

Decisions that need exactly one answer for all ranks, such as "which N
gradients of step t came first" for backup workers, are made with the
store's atomic ``add``: the k-th caller gets k, whoever it is, and nothing
else is central. Bulk data never goes through it.

Where the store lives decides which ranks may die:

* **launcher-hosted** (preferred): ``commrt train --nproc`` hosts a store in
  the launcher process and exports ``COMMRT_STORE=host:port``; under
  torchrun the elastic agent hosts one (``TORCHELASTIC_USE_AGENT_STORE=true``
  with ``MASTER_ADDR``/``MASTER_PORT``). Any worker may then die.
* **rank 0** otherwise (plain ``mpiexec``, or ``commrt.init`` with explicit
  ranks): rank 0 hosts it in a background thread of its own process and
  tells the others its port. Then **rank 0's death is fatal** for the
  control plane (the others get ``CommTimeoutError``), and rank 0's
  ``close`` waits until every other rank is done with the store.

Example::

    >>> from commrt.runtime.store import ControlStore
    >>> cs = ControlStore.open(comm)                  # every rank of comm together
    >>> cs.client("backup/0").add("arrivals/0", 1)   # 1 for the first caller
    1
"""

from __future__ import annotations

import datetime
import enum
import os
from dataclasses import dataclass

from commrt import settings
from commrt.process.rendezvous import DEFAULT_TIMEOUT_S, serve
from commrt.runtime import rows


class Host(enum.Enum):
    LAUNCHER = "launcher"  # commrt's own launcher (COMMRT_STORE)
    AGENT = "torchrun agent"  # torchrun's elastic agent
    RANK0 = "rank 0"  # rank 0 of the job: its death ends the control plane


def _parse(spec: str) -> tuple[str, int]:
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"{settings.STORE.name}={spec!r}: expected host:port, e.g. 127.0.0.1:29500"
        )
    return host, int(port)


def launcher_store(env=None) -> tuple[str, int, Host] | None:
    """(host, port, who) of a store hosted outside the workers, if the launcher says so."""
    env = os.environ if env is None else env
    if env.get(settings.STORE.name):
        return (*_parse(env[settings.STORE.name]), Host.LAUNCHER)
    if (
        env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        and env.get("MASTER_ADDR")
        and env.get("MASTER_PORT", "").isdigit()
    ):
        return env["MASTER_ADDR"], int(env["MASTER_PORT"]), Host.AGENT
    return None


def host_store(host: str = "127.0.0.1"):
    """A TCPStore server on a free port (for launchers); returns it (``.port`` says where).

    It listens on ``host`` only (loopback by default), not on every interface."""
    return serve(host, 0, DEFAULT_TIMEOUT_S)


@dataclass(eq=False)
class ControlStore:
    """Where the store is, and a way to open clients to it under one key prefix.

    Each client is its own TCP connection: a thread blocked in ``wait`` on
    one client does not hold up another thread's client.
    """

    host: str
    port: int
    where: Host
    timeout: float
    server: object = None  # the TCPStore server, when this rank hosts it

    @classmethod
    def open(cls, comm, timeout: float | None = None) -> "ControlStore":
        """The job's control store, opened once per communicator (kept in ``comm.slots``).

        Collective the first time when rank 0 must host it (it broadcasts the port)."""
        if comm.slots.control_store is None:
            timeout = comm.timeout if timeout is None else float(timeout)
            comm.slots.control_store = cls._open(comm, timeout)
        return comm.slots.control_store

    @classmethod
    def _open(cls, comm, timeout: float) -> "ControlStore":
        found = launcher_store()
        if found is not None:
            return cls(found[0], found[1], found[2], timeout)
        server, host = None, os.environ.get("MASTER_ADDR") or "127.0.0.1"
        parts = [0.0] * 5
        if comm.rank == 0:
            server = _tcp(host, 0, True, timeout)
            parts = [float(x) for x in _ipv4(host)] + [float(server.port)]
        # rank 0's row is its address; every other rank's row is zeros
        vals = [int(v) for v in rows.gather(comm, parts)[0]]
        return cls(".".join(map(str, vals[:4])), vals[4], Host.RANK0, timeout, server)

    def client(self, prefix: str):
        """A new connection to the store, its keys under ``prefix`` (a ``PrefixStore``)."""
        import torch.distributed as dist

        return dist.PrefixStore(prefix, _tcp(self.host, self.port, False, self.timeout))

    @property
    def hosted_here(self) -> bool:
        return self.server is not None


def _tcp(host: str, port: int, master: bool, timeout: float):
    import torch.distributed as dist

    if master:
        return serve(host, port, timeout)
    return dist.TCPStore(
        host,
        port,
        is_master=master,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )


def _ipv4(host: str) -> list[int]:
    import socket

    return [int(x) for x in socket.gethostbyname(host).split(".")]
