"""Shared test set-up.

Triton reads TRITON_INTERPRET when it is first imported, so it is set here,
before any test module imports commrt.kernels: the same @triton.jit kernels
then run on CPU tensors.
"""

import os
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

# tools/ (the namespace-host harness, netns.py) is not a test module: tests import it from there
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
if TOOLS not in sys.path:
    sys.path.append(TOOLS)


@pytest.fixture
def netns_cluster():
    """Make namespace hosts (tools/netns.py): ``netns_cluster(hosts, rate="1gbit")``.

    Skips the test with the reason where namespaces cannot be made (not
    root, no ip/tc, creation refused); tears every cluster down afterwards,
    also when the test failed.
    """
    from netns import Cluster, Unavailable

    made = []

    def make(hosts: int, rate: str | None = "1gbit") -> Cluster:
        try:
            c = Cluster(hosts, rate=rate)
        except Unavailable as e:
            pytest.skip(str(e))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
