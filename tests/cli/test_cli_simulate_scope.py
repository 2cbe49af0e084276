"""``commrt simulate`` by default is a short run (it took 64 s and printed 225 lines); the
long sweep is ``--full`` away, and a knob the user gives stands either way. The legend of
auto's abbreviated choice ("tp = torus2d_pipelined") stands under a table that shows one,
and under no other."""

import argparse

from commrt.cli import simulate


def _args(*argv):
    parser = argparse.ArgumentParser()
    simulate.register(parser.add_subparsers(dest="command"))
    return simulate.scoped(parser.parse_args(["simulate", *argv]))


def test_the_default_is_short_and_the_long_run_a_flag_away():
    short, full = _args(), _args("--full")
    assert (short.max_p, short.at_p, short.samples) == simulate.SHORT == (64, 64, 100)
    assert (full.max_p, full.at_p, full.samples) == simulate.FULL == (4096, 1024, 400)
    assert short.short_run and not full.short_run
    given = _args("--full", "--max-p", "256")
    assert (given.max_p, given.at_p, given.short_run) == (256, 1024, False)
    assert not _args("--max-p", "8").short_run  # the user chose it: no note


def test_the_short_run_says_so_and_fits_a_screenful_or_two():
    lines = []
    simulate.run(_args("--no-plots"), out=lines.append)
    text = "\n".join(lines).splitlines()
    assert text[-1] == "# a short run, p up to 64: --full sweeps p up to 4096", text[-3:]
    assert len(text) <= 160 and any("p=64" in ln for ln in text)


def test_the_choice_legend_stands_only_under_a_table_that_abbreviates():
    lines = []
    args = _args("--no-plots", "--only", "vs-p", "--max-p", "8", "--sizes", "64K,256M")
    simulate.run(args, out=lines.append)  # up to 8 ranks auto never picks tp
    assert not any("tp = torus2d_pipelined" in ln for ln in lines), lines
    lines.clear()
    args = _args("--no-plots", "--only", "vs-p", "--max-p", "16", "--sizes", "256M")
    simulate.run(args, out=lines.append)
    text = "\n".join(lines).splitlines()
    at = text.index("# auto's choice: tp = torus2d_pipelined")
    assert "tp(2x8" in text[at - 1], text  # right under the table's last row
