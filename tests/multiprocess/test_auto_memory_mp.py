"""auto's memory across jobs on real ranks (commrt.tuning.memory).

Two jobs of 2 gloo ranks run tests/workers/auto_memory_worker.py one after the other. Rank
0's ``COMMRT_AUTO_MEMORY`` names one file; rank 1's an empty folder's, so what rank 1 starts
from can only be what rank 0 read and shared. The second job starts each size from the
first job's verdict, on both ranks alike, and every sum is right."""

import json

from helpers.mp import GlooJob


def _job(tmp_path, name: str) -> dict:
    out = tmp_path / name
    out.mkdir()
    job = GlooJob("auto_memory_worker.py", (out,), 2)
    job.start(0, COMMRT_AUTO_MEMORY=str(tmp_path / "rank0" / "auto-memory.json"))
    job.start(1, COMMRT_AUTO_MEMORY=str(tmp_path / "rank1" / "auto-memory.json"))
    codes, outs = job.finish(240)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_a_second_job_starts_from_the_first_jobs_verdicts_on_every_rank(tmp_path):
    first = _job(tmp_path, "first")
    assert (tmp_path / "rank0" / "auto-memory.json").exists()
    assert not (tmp_path / "rank1").exists()  # only rank 0 writes
    second = _job(tmp_path, "second")
    for job in (first, second):
        assert job[0] == job[1]  # every rank decided alike
        assert all(size["right"] for size in job[0].values()), job[0]
    for nbytes, size in second[0].items():
        assert not first[0][nbytes]["remembered"]
        assert size["remembered"] and size["began"] == first[0][nbytes]["kept"], (nbytes, size)
