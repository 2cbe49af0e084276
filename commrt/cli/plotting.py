"""The few matplotlib steps every commrt plot shares (headless, PNG)."""

from __future__ import annotations

from typing import Mapping, Sequence


def figure(ncols: int = 1, size: tuple[float, float] = (7.0, 4.5)):
    """A headless figure with ``ncols`` axes side by side: (fig, [axes])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=size, squeeze=False)
    return fig, list(axes[0])


def style(
    ax,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: int | None = 2,
    logy: bool = False,
    title_size: float | None = None,
) -> None:
    """Log-2 x axis (sizes, ranks), optional log y, grid and legend."""
    if logx:
        ax.set_xscale("log", base=logx)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=title_size)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def save(fig, path: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def line_plot(
    path: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> str:
    """One line with markers per series name -> (xs, ys); log-2 x axis."""
    fig, (ax,) = figure()
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    style(ax, xlabel=xlabel, ylabel=ylabel, title=title)
    return save(fig, path)


def formats() -> list[str]:
    """The file extensions ``savefig`` writes (png, pdf, svg, ...), without the dot."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())
