"""What a hung rank job leaves behind (tests/helpers/mp.py's GlooJob.finish): every
rank's output with its Python stacks, and each output saved where COMMRT_TEST_LOGS says
(the GPU check sets it under $OUT, so a hang on a lent GPU still leaves evidence)."""

import signal
import time

import pytest
from helpers.mp import GlooJob


@pytest.mark.slow
def test_a_hung_job_ends_with_each_ranks_stacks_and_its_outputs_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMRT_TEST_LOGS", str(tmp_path))
    job = GlooJob("hang_worker.py", [], 2)
    for r in range(2):
        job.start(r)
    began = time.monotonic()
    codes, outs = job.finish(timeout=8)
    assert codes == [-signal.SIGABRT] * 2, (codes, outs)
    assert time.monotonic() - began < 8 + 2 * 5, "finish() outlived its timeout and dump"
    for out in outs:
        assert out.startswith("started") and "Fatal Python error: Aborted" in out, out
        assert 'hang_worker.py", line 9 in hang_here' in out, out
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert len(saved) == 2 and saved[0].startswith("hang_worker-"), saved
    for r, name in enumerate(saved):
        text = (tmp_path / name).read_text()
        assert name.endswith(f"-rank{r}.txt") and "exit -6 (hung" in text.splitlines()[0]
        assert text.splitlines()[1:] == outs[r].splitlines(), text
