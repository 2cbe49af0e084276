"""PyTorch's own distributed suite (distributed_test.py) with BACKEND=commrt, 2 ranks.

Usage: td_conformance.py REPORT.json [TEST_NAME_PREFIX ...]; with no names, every
case of ``DistributedTest._DistTestBase`` runs ("*" stands for all the others);
with COMMRT_CONFORMANCE_EXACT=1 the names are whole case names. commrt is added to the
suite's "ddp", "subgroup" and "plugin" backend features, so the DDP and
subgroup cases run for it as they do for gloo. Writes
{"run", "passed", "skipped", "failed": {name: text}, "skips": {name: reason}}.
Each case forks its own 2 ranks (file:// rendezvous, init_method=), in which
``import commrt`` (done here, before the fork) has registered the backend.
BACKEND=gloo in the environment runs the same cases over gloo (the reference).
"""

import json
import os
import sys
import tempfile
import time
import unittest

#: COMMRT_CONFORMANCE_GATES=gloo: the suite's backend gates (decided when it is imported)
#: open as they do for gloo, and the cases then run over commrt: the cases the suite
#: reserves for named backends ("requires backend to be one of {gloo, nccl}"), reported
#: apart from the plain run
GATES = os.environ.get("COMMRT_CONFORMANCE_GATES")
os.environ.setdefault("BACKEND", "commrt")
RUN_BACKEND = os.environ["BACKEND"]
if GATES:
    os.environ["BACKEND"] = GATES
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    # setdefault(..., mkdtemp()) made a directory on every run, the test's TEMP_DIR given
    # or not, and left it behind; this one goes when the runner exits (the forked ranks
    # leave through os._exit and do not remove it under the others)
    _SCRATCH = tempfile.TemporaryDirectory(prefix="commrt-conformance-")
    os.environ["TEMP_DIR"] = _SCRATCH.name

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

import commrt  # noqa: E402,F401  (registers the backend in every rank)

for feature in ("ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[feature].add("commrt")
# excluded, with the reason: a receive from any source is not implemented (commrt's
# transports match (peer, tag); dist.recv(t) without src raises NotImplementedError naming it)
DistTestCases.skip_collective["sendrecv anysource"].add("commrt")

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

if GATES:  # the gates are set; the ranks (forked, so they inherit both) use the real backend
    os.environ["BACKEND"] = distributed_test.BACKEND = RUN_BACKEND


class TestCommrtBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # forked ranks, not spawned: a spawned rank imports torch and this whole suite again
        # for every case (5-15 s a case here, 30 s under load); a forked one starts in well
        # under a second. The runner's process makes no group and starts no thread first.
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


#: where each case's outcome is appended as it ends (a long run can be read part-way)
LOG = os.environ.get("COMMRT_CONFORMANCE_LOG")


class _Result(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ok, self.started = [], {}

    def _log(self, test, outcome, text=""):
        if LOG:
            took = time.monotonic() - self.started.get(test.id(), time.monotonic())
            row = {"case": test.id().rsplit(".", 1)[-1], "outcome": outcome, "s": round(took, 1)}
            with open(LOG, "a") as f:
                f.write(json.dumps(dict(row, text=text[-600:])) + "\n")

    def startTest(self, test):
        self.started[test.id()] = time.monotonic()
        super().startTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self.ok.append(test.id())
        self._log(test, "passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._log(test, "skipped", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._log(test, "failed", self.failures[-1][1])

    def addError(self, test, err):
        super().addError(test, err)
        self._log(test, "error", self.errors[-1][1])


def main(out, prefixes):
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestCommrtBackend)
    if os.environ.get("COMMRT_CONFORMANCE_EXACT") == "1":  # exactly these cases
        names = [n for n in prefixes if n in names]
    elif prefixes:  # in the order the prefixes are given
        names = [n for p in prefixes for n in names if n == p or n.startswith(p + "_") or p == "*"]
        names = list(dict.fromkeys(names))
    suite = unittest.TestSuite(TestCommrtBackend(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2, resultclass=_Result, stream=sys.stdout).run(suite)

    def short(t):
        return t.id().rsplit(".", 1)[-1]

    report = {
        "run": result.testsRun,
        "passed": len(result.ok),
        "skipped": len(result.skipped),
        "failed": {short(t): text[-1500:] for t, text in result.failures + result.errors},
        "skips": {short(t): reason for t, reason in result.skipped},
        "passes": sorted(i.rsplit(".", 1)[-1] for i in result.ok),
    }
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
