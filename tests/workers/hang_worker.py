"""A rank that hangs in ``hang_here`` (after saying it started), for the rank-job
helpers' own test: what a hung rank leaves behind (tests/unit/test_rank_jobs.py)."""

import time


def hang_here() -> None:
    print("started", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    hang_here()
