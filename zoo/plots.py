"""Plots a suite draws for its section: log-log curves over n, one line per variant, labelled at their ends, and
the helpers every plot shares (a non-interactive backend, PNG bytes, a style fixed per variant name)."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pandas as pd

LINE_STYLES = ("-", "--", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
          "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#e7ba52", "#5254a3",
          "#e6550d", "#6b6ecf", "#b5cf6b", "#d6616b", "#ce6dbd", "#31a354")  # no grey: grey is for
# variants not ranked; at least as many as the built-ins, so each of them has its own


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


@dataclass(frozen=True)
class Panel:
    """One panel of a plot: its title, the variants on it (None: every one) and the callable whose rows draw its
    reference line (``reference``: their ``versus``), labelled ``reference_label``."""

    title: str = ""
    variants: frozenset[str] | None = None
    reference: str | None = None
    reference_label: str = ""


def kind_panels(board, references: dict[str, tuple[str, str]]) -> list[Panel]:
    """One panel per kind of variant on ``board`` (cores, layers), each with its own reference line:
    ``references`` maps a kind to (the callable its rows are about, its label)."""
    from .board import KIND_TITLES

    return [Panel(title, frozenset(v for v in board.variants if board.kind(v) == kind), *references.get(kind, (None, "")))
            for kind, title in KIND_TITLES.items() if any(board.kind(v) == kind for v in board.variants)]


def unranked(board) -> frozenset[str]:
    """The variants ``board`` does not rank: drawn grey."""
    return frozenset(v for v in board.variants if not board.ranked(v))


def log_log(rows: pd.DataFrame, check: str, name: str, ylabel: str, reference: str | None = None,
            reference_label: str = "", xlabel: str = "sequence length n", panels: list[Panel] | None = None,
            greyed: frozenset[str] = frozenset(), palette: tuple[str, ...] = ()) -> tuple[str, bytes] | None:
    """Each variant's own ``check`` values over n, one line per variant (``rows`` already chosen: one suite, mode
    and phase) in the style its name always gets, its interval (``low``-``high``) shaded where the rows have one,
    and the median over n of the rows about the reference callable as a dashed black line; ``panels`` side by
    side (each kind against its own comparator), else one of every variant against ``reference``; ``greyed``
    variants (not ranked) drawn grey; ``palette``: every variant of the board, so each keeps its colour on every
    plot of it. Where the rows mix modes (each variant's primary mode), a causal line says so and the reference is
    the comparator's non-causal call. None without values."""
    rows = rows.dropna(subset=["value", "n"])
    ours = rows[(rows.check == check) & (rows.versus == "")]
    if ours.empty:
        return None
    mixed = "mode" in ours and ours["mode"].nunique() > 1  # causal-only variants beside the others: labelled
    panels = [p for p in panels or [Panel("", None, reference, reference_label)]
              if p.variants is None or p.variants & set(ours.variant)]
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(9 * len(panels), 5.5), squeeze=False)
    styles = variant_styles(sorted(set(ours.variant) | set(palette)))
    for ax, panel in zip(axes[0], panels):
        ends = []
        for variant, series in ours.groupby("variant"):
            if panel.variants is not None and variant not in panel.variants:
                continue
            series = series.sort_values("n")
            color, marker, dashes = styles[variant] if variant not in greyed else ("0.7", "x", ":")
            label = variant + (" (causal)" if mixed and (series["mode"] == "causal").all() else "") + (
                " (not ranked)" if variant in greyed else "")
            ax.plot(series.n.astype(float), series.value.astype(float), color=color, marker=marker, linestyle=dashes, label=label)
            if {"low", "high"} <= set(series) and series[["low", "high"]].notna().all().all():
                ax.fill_between(series.n.astype(float), series.low.astype(float), series.high.astype(float), color=color,
                                alpha=0.15, lw=0)
            ends.append((float(series.n.iloc[-1]), float(series.value.iloc[-1]), label, color))
        about = rows[(rows.check == check) & (rows.versus == panel.reference)]
        if mixed:  # the comparator's non-causal call, the mode most variants are read in
            about = about[about["mode"] == "full"]
        ref = about.groupby("n").value.median() if panel.reference else pd.Series(dtype=float)
        if not ref.empty:
            ax.plot(ref.index.astype(float), ref.values, color="black", linestyle="--", linewidth=2,
                    label=panel.reference_label)
            ends.append((float(ref.index[-1]), float(ref.values[-1]), panel.reference_label, "black"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if panel.title:
            ax.set_title(panel.title)
        ax.grid(True, which="both", alpha=0.3)
        label_line_ends(ax, ends)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.22, 1.0), frameon=False)
    return save(plt, fig, name)


def builtin_variants() -> list[str]:
    """The built-in variants' names (the default registry's, loaded already where a board is drawn)."""
    from .api import default_registry

    return sorted(name for name, variant in default_registry().variants.items()
                  if variant.origin is not None and variant.origin.kind == "builtin")


def variant_styles(variants: list[str], builtins: list[str] | None = None) -> dict[str, tuple]:
    """Each variant's colour, marker and line style, from its name: the colour its name hashes to or, where a name
    placed before it has that one, the next free one (colours repeat only past their number, with another marker).
    The built-ins (``builtins``, default :func:`builtin_variants`) are placed first, all of them, so each has the
    same style on every board, whichever variants it shows; other names follow in order."""
    import zlib

    builtins = builtin_variants() if builtins is None else sorted(builtins)
    used, styles = set(), {}
    for variant in builtins + sorted(set(variants) - set(builtins)):
        code = zlib.crc32(variant.encode())
        colour = code % len(COLORS)
        for step in range(len(COLORS)):
            if (colour + step) % len(COLORS) not in used:
                colour = (colour + step) % len(COLORS)
                break
        used = used | {colour} if len(used) + 1 < len(COLORS) else set()
        styles[variant] = (COLORS[colour], MARKERS[(code // len(COLORS)) % len(MARKERS)],
                           LINE_STYLES[(code // (len(COLORS) * len(MARKERS))) % len(LINE_STYLES)])
    return {variant: styles[variant] for variant in variants}


def label_points(ax, points, fontsize: int = 8):
    """Each point named beside it: to its right, else a line at a time above or below, else to its left (with a
    leader line where it moved), the first place that overlaps no label already placed and stays inside the axes,
    so no two labels collide and none covers the title; where no such place is left, above the others."""
    fig = ax.figure
    fig.canvas.draw()  # the axes' limits and scales are final: data -> pixels is fixed
    placed = []
    line = fontsize * 1.3 * fig.dpi / 72
    frame = ax.bbox

    def overlaps(left, bottom, width):
        return any(left < r and left + width > l and bottom < t and bottom + line > b for l, b, r, t in placed)

    def free(left, bottom, width):
        return (frame.x0 <= left and left + width <= frame.x1 and frame.y0 <= bottom and bottom + line <= frame.y1
                and not overlaps(left, bottom, width))

    for x, y, text in sorted(points, key=lambda p: (p[1], p[0])):
        px, py = ax.transData.transform((x, y))
        width = len(text) * fontsize * 0.6 * fig.dpi / 72
        shifts = [0] + [sign * step for step in range(1, 7) for sign in (1, -1)]
        spots = [(px + 5, py + 3 + k * line) for k in shifts] + [(px - 5 - width, py + 3 + k * line) for k in shifts]
        left, bottom = next(((l, b) for l, b in spots if free(l, b, width)), (px + 5, py + 3))
        while overlaps(left, bottom, width):
            bottom += line
        placed.append((left, bottom, left + width, bottom + line))
        ax.annotate(text, (x, y), xytext=(left - px, bottom - py), textcoords="offset pixels", fontsize=fontsize,
                    arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5) if (left, bottom) != (px + 5, py + 3)
                    else None)
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
