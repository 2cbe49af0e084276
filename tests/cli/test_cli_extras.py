"""The train extra: scikit-learn, matplotlib and tqdm are optional (core is torch and numpy).

A command that lacks one says which, and how to install it, in one line with
exit status 2 before any rank starts; without tqdm the progress bar falls
back to plain epoch lines. A missing package is simulated with
``sys.modules[name] = None``, which makes its import fail and its spec
unfindable, as when it is not installed.
"""

import io
import sys

import pytest

from commrt.cli import main
from commrt.cli.train_output import ProgressBar

INSTALL = "pip install 'commrt[train]'"


def _missing(monkeypatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _one_line_error(argv, capsys) -> tuple[str, str]:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return out, err.strip()


def test_train_without_scikit_learn_says_so_before_starting_ranks(monkeypatch, capsys):
    _missing(monkeypatch, "sklearn")
    out, err = _one_line_error(["train", "--nproc", "2"], capsys)
    assert err == f"commrt train needs scikit-learn: {INSTALL}"
    assert "starting" not in out  # no rank was started


@pytest.mark.parametrize("what", [["bench", "kernels"], ["bench", "allreduce"]])
def test_plot_without_matplotlib_says_so(what, monkeypatch, capsys, tmp_path):
    _missing(monkeypatch, "matplotlib")
    _, err = _one_line_error([*what, "--plot", str(tmp_path / "p.png")], capsys)
    assert err == f"commrt {' '.join(what)} --plot needs matplotlib: {INSTALL}"


def test_simulate_without_matplotlib_says_so_and_runs_with_no_plots(monkeypatch, capsys, tmp_path):
    _missing(monkeypatch, "matplotlib")
    argv = ["simulate", "--max-p", "4", "--at-p", "4", "--samples", "5"]
    _, err = _one_line_error([*argv, "--out-dir", str(tmp_path)], capsys)
    assert err == f"commrt simulate needs matplotlib: {INSTALL}, or pass --no-plots"
    assert main([*argv, "--no-plots"]) == 0
    assert main(["simulate", "--only", "control", "--max-p", "8"]) == 0  # draws no figure


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_tqdm_the_bar_prints_plain_epoch_lines(monkeypatch):
    _missing(monkeypatch, "tqdm")
    stream = _Terminal()
    bar = ProgressBar(total=4, enabled=True, stream=stream)
    bar.update(2, "epoch 1/2 loss 0.5")
    bar.line("epoch 1/2 loss 0.500 acc 0.900")
    bar.close()
    assert bar.bar is None and stream.getvalue() == "epoch 1/2 loss 0.500 acc 0.900\n"
