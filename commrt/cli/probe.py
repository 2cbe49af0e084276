"""``commrt probe``: measure this job's network as ``algorithm="auto"`` does, and save it.

Run it as the job will run (the same launcher, ranks per host and
backend), on a quiet machine, then point later jobs at the file::

    commrt probe --nproc 4 --save calib.json          # or under mpiexec / torchrun
    COMMRT_CALIBRATION=calib.json python train.py     # auto loads it instead of probing

Rank 0 prints the model (both tiers when the ranks span hosts), the agreed
step times, each sanity check that still failed after a second
measurement, and what ``auto`` would choose at a few sizes on it.
"""

from __future__ import annotations

import textwrap

from commrt.cli.flags import rank_flags
from commrt.cli.units import output_file, positive_int, size_list

#: buffer sizes whose choice is printed (small to large gradient buckets)
SHOW_SIZES = "64K,1M,16M,64M"


def register(sub) -> None:
    """Add ``probe`` to ``commrt``'s sub-commands (it runs on every rank, like ``bench
    allreduce``: --nproc, --backend and --timeout)."""
    p = sub.add_parser("probe", help="measure α and β of this job's links (for auto), save them")
    rank_flags(p)
    p.add_argument(
        "--save", metavar="FILE", type=output_file, help="write the calibration here (JSON)"
    )
    p.add_argument(
        "--repeats", type=positive_int, default=5, help="timed runs per size (default 5)"
    )
    p.add_argument(
        "--sizes",
        type=size_list,
        default=size_list(SHOW_SIZES),
        help=f"buffer sizes to show auto's choice for (default {SHOW_SIZES})",
    )
    p.set_defaults(run=cmd_probe, parser=p)


def cmd_probe(args) -> int:
    import commrt
    from commrt.algorithms import Auto
    from commrt.sim.links import fmt_bytes
    from commrt.tuning.probe import probe

    comm = commrt.init(args.backend, timeout=args.timeout)
    # measured even if COMMRT_CALIBRATION names a file: this command makes calibrations
    res = probe(comm, repeats=args.repeats, force=True)
    if comm.rank == 0:
        say(str(res))
        say(
            "step times: "
            + ", ".join(f"{fmt_bytes(s)} {t * 1e6:.0f} µs" for s, t in zip(res.sizes, res.step_s))
        )
        if res.two_tier:
            shared = ", ".join(
                f"{fmt_bytes(s)} {t * 1e6:.0f} µs" for s, t in zip(res.sizes, res.inter_step_s)
            )
            say(f"between hosts, every rank at once: {shared}")
        for w in res.warnings:
            say(f"warning: {w}")
        auto = Auto(network=res.network())
        for nbytes in args.sizes:
            say(str(auto.choose(comm.world_size, nbytes)))
        if args.save:
            say(f"saved {res.save(args.save)} (load it with COMMRT_CALIBRATION={args.save})")
    comm.close()
    return 0


def say(text: str) -> None:
    """Print ``text`` within 80 columns (continuations indented; paths kept whole)."""
    print(textwrap.fill(text, 80, subsequent_indent="  ", break_long_words=False))
