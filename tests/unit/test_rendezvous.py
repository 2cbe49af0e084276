"""commrt.process.rendezvous: a rank that never comes to the rendezvous ends ``commrt.init``
with a :class:`~commrt.errors.RendezvousTimeoutError` saying how many came (on the host)
or that the host was not reached, not torch's "1/2 clients joined"; an error that is not
a timeout (a port taken) stays torch's. Each case is a fresh process, as a rank is."""

import json
import os
import socket
import subprocess
import sys

from helpers.mp import free_port

INIT = """
import json, time, commrt
t0 = time.monotonic()
try:
    commrt.init("gloo", timeout=1)
except Exception as e:
    said = dict(type=type(e).__name__, msg=str(e), s=time.monotonic() - t0)
    said.update({k: getattr(e, k, None) for k in ("joined", "world_size", "address", "rank")})
    print(json.dumps(said))
"""


def _init(rank: int, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_USE_AGENT_STORE"}
    env.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    out = subprocess.run(
        [sys.executable, "-c", INIT], env=env, capture_output=True, text=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_host_says_how_many_ranks_came():
    port = free_port()
    said = _init(0, port)
    assert said["type"] == "RendezvousTimeoutError", said
    assert (said["joined"], said["world_size"], said["rank"]) == (1, 2, 0), said
    assert said["address"] == f"127.0.0.1:{port}"
    assert "rank 0 timed out after 1 s at the rendezvous" in said["msg"]
    assert "1 of 2 ranks came" in said["msg"] and "Traceback" not in said["msg"]


def test_a_rank_that_cannot_reach_the_host_says_so():
    said = _init(1, free_port())
    assert said["type"] == "RendezvousTimeoutError", said
    assert said["joined"] is None and said["rank"] == 1, said
    assert "reaching the rendezvous store at 127.0.0.1:" in said["msg"], said


def test_a_port_taken_is_not_called_a_timeout():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        said = _init(0, taken.getsockname()[1])
    assert said["type"] != "RendezvousTimeoutError", said
    assert "address already in use" in said["msg"], said


def test_commrt_train_names_its_own_flag_for_the_timeout():
    """A library user raises the timeout with commrt.init(timeout=...); a user of
    `commrt train` with --timeout, so its lines say that (the rendezvous's and a peer's)."""
    from commrt.cli.train_faults import in_cli_terms
    from commrt.errors import CommTimeoutError, RendezvousTimeoutError

    errors = [
        RendezvousTimeoutError(rank=0, timeout_s=3, address="h:1", world_size=2, joined=1),
        RendezvousTimeoutError(rank=1, timeout_s=3, address="h:1", world_size=2),
        CommTimeoutError(rank=0, peer=1, timeout_s=3, what="recv", step=4),
    ]
    for e in errors:
        assert "commrt.init(timeout=...)" in str(e)
        said = in_cli_terms(e)
        assert "the timeout with --timeout" in said and "commrt.init" not in said, said
