"""Plots a suite draws for its section: log-log curves over n, one line per variant, labelled at their ends, and
the helpers every plot shares (a non-interactive backend, PNG bytes, line styles that never repeat)."""

from __future__ import annotations

import io

import pandas as pd

LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def save(plt, fig, name: str) -> tuple[str, bytes]:
    """The figure as (file name, PNG bytes)."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return name, buffer.getvalue()


def pyplot():
    """matplotlib's pyplot on the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_log(rows: pd.DataFrame, check: str, name: str, ylabel: str, reference: str | None = None,
            reference_label: str = "", xlabel: str = "sequence length n") -> tuple[str, bytes] | None:
    """Each variant's own ``check`` values over n, one line per variant (``rows`` already chosen: one suite, mode
    and phase), and the median over n of the rows of ``check`` about the callable ``reference`` (their ``versus``)
    as a dashed black line labelled ``reference_label``; None without values."""
    rows = rows.dropna(subset=["value", "n"])
    ours = rows[(rows.check == check) & (rows.versus == "")]
    if ours.empty:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ends = []
    for index, (variant, series) in enumerate(ours.groupby("variant")):
        series = series.sort_values("n")
        color, marker, dashes = line_style(index)
        ax.plot(series.n.astype(float), series.value, color=color, marker=marker, linestyle=dashes, label=variant)
        ends.append((float(series.n.iloc[-1]), float(series.value.iloc[-1]), variant, color))
    ref = (rows[(rows.check == check) & (rows.versus == reference)].groupby("n").value.median() if reference
           else pd.Series(dtype=float))
    if not ref.empty:
        ax.plot(ref.index.astype(float), ref.values, color="black", linestyle="--", linewidth=2, label=reference_label)
        ends.append((float(ref.index[-1]), float(ref.values[-1]), reference_label, "black"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    label_line_ends(ax, ends)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.22, 1.0), frameon=False)
    return save(plt, fig, name)


def line_style(index: int):
    """A colour, marker and line style per series, so no two of up to 20 x 8 lines look alike."""
    import matplotlib

    colors = matplotlib.colormaps["tab20"].colors
    return (colors[index % len(colors)], MARKERS[index % len(MARKERS)],
            LINE_STYLES[(index // len(MARKERS)) % len(LINE_STYLES)])


def label_points(ax, points, fontsize: int = 8):
    """Each point named beside it; a label that would overlap one already placed moves up a line at a
    time (with a leader line to its point), so no two labels collide."""
    fig = ax.figure
    fig.canvas.draw()  # the axes' limits and scales are final: data -> pixels is fixed
    placed = []
    line = fontsize * 1.3 * fig.dpi / 72
    for x, y, text in sorted(points, key=lambda p: (p[1], p[0])):
        px, py = ax.transData.transform((x, y))
        width = len(text) * fontsize * 0.6 * fig.dpi / 72
        left, bottom = px + 5, py + 3
        while any(left < r and left + width > l and bottom < t and bottom + line > b for l, b, r, t in placed):
            bottom += line
        placed.append((left, bottom, left + width, bottom + line))
        ax.annotate(text, (x, y), xytext=(left - px, bottom - py), textcoords="offset pixels", fontsize=fontsize,
                    arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5) if bottom > py + 3 else None)
    return placed


def label_line_ends(ax, ends, min_gap_decades: float = 0.07):
    """Each line named at its right end; labels pushed apart (on the log y axis) so none overlaps another."""
    if not ends:
        return
    import math

    right = max(x for x, _, _, _ in ends)
    placed: list[float] = []
    for x, y, text, color in sorted(ends, key=lambda end: end[1]):
        position = math.log10(y) if y > 0 else 0.0
        if placed and position < placed[-1] + min_gap_decades:
            position = placed[-1] + min_gap_decades
        placed.append(position)
        ax.annotate(text, xy=(x, y), xytext=(right * 1.12, 10 ** position), fontsize=7, color=color, va="center",
                    arrowprops=dict(arrowstyle="-", color=color, lw=0.5, alpha=0.6), annotation_clip=False)
