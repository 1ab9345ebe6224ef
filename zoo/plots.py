"""Plots a suite draws for its section: log-log curves over n, one line per variant, labelled at their ends, and
the helpers every plot shares (a non-interactive backend, PNG bytes, a style fixed per variant name, labels placed where
they cover no point, legend or other label)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import inspect
import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

LINE_STYLES = ("-", "--", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
          "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#e7ba52", "#5254a3",
          "#e6550d", "#6b6ecf", "#b5cf6b", "#d6616b", "#ce6dbd", "#31a354")  # no grey: grey is for
# variants not ranked; at least as many as the built-ins, so each of them has its own
GREY = "0.7"
"""The colour of a variant the board does not rank, on every plot (its line dotted, its marker an x)."""
GREY_STYLE = (GREY, "x", ":")


INPUTS_KEY = "zoo-inputs"
"""The PNG text chunk holding the sha256 of what a plot was drawn from (:func:`drawn_once`)."""
_DRAWN: contextvars.ContextVar[dict[str, tuple[str, bytes]] | None] = contextvars.ContextVar("drawn", default=None)
_INPUTS: contextvars.ContextVar[str | None] = contextvars.ContextVar("inputs", default=None)


def save(plt, fig, name: str) -> tuple[str, bytes]:
    """The figure as (file name, PNG bytes): laid out, then its points' labels placed (:func:`place_labels`), once
    every pixel is where it will be drawn; inside :func:`drawn_once`, with what it was drawn from."""
    fig.tight_layout()
    place_labels(fig)
    buffer = io.BytesIO()
    inputs = _INPUTS.get()
    fig.savefig(buffer, format="png", dpi=100, metadata={INPUTS_KEY: inputs} if inputs else None)
    plt.close(fig)
    return name, buffer.getvalue()


@contextlib.contextmanager
def reusing(folder: Path):
    """Inside it, a plot function wrapped in :func:`drawn_once` returns a plot of ``folder`` instead of drawing
    where that plot was drawn from the same inputs by the same code: its PNG says so (:data:`INPUTS_KEY`). A board
    drawn again, most of whose plots did not change (counted FLOPs, carried quality rows), skips drawing them."""
    from PIL import Image

    drawn = {}
    for path in sorted(Path(folder).glob("*.png")):
        try:
            data = path.read_bytes()
            key = Image.open(io.BytesIO(data)).text.get(INPUTS_KEY)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            continue
        if key:
            drawn[key] = (path.name, data)
    token = _DRAWN.set(drawn)
    try:
        yield
    finally:
        _DRAWN.reset(token)


def drawn_once(draw):
    """``draw`` (a plot function returning (file name, PNG bytes) or None), returning the plot :func:`reusing`
    found drawn from the same inputs instead of drawing it again. The inputs: its arguments (data frames by
    content), its own module's and this module's source, the built-ins' names (their colours) and matplotlib's
    version; a call whose arguments cannot be read so is drawn."""
    @functools.wraps(draw)
    def reused(*args, **kwargs):
        key = _inputs_key(draw, args, kwargs)
        found = (_DRAWN.get() or {}).get(key) if key else None
        if found is not None:
            return found
        token = _INPUTS.set(key)
        try:
            return draw(*args, **kwargs)
        finally:
            _INPUTS.reset(token)

    return reused


def _inputs_key(draw, args, kwargs) -> str | None:
    """The sha256 of what :func:`drawn_once` keys ``draw``'s call on; None where a part cannot be read (arguments
    of another kind, a function whose source file is not there)."""
    import matplotlib

    try:
        parts = (matplotlib.__version__, draw.__qualname__, Path(inspect.getsourcefile(draw)).read_bytes(),
                 Path(__file__).read_bytes(), repr(builtin_variants()), repr(_plain([args, kwargs])))
    except (TypeError, OSError):
        return None
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
    return digest.hexdigest()


def _plain(value):
    """``value`` as nested lists, tuples and scalars that print the same in every process (no set order, no
    object address); TypeError where it holds anything else."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (pd.DataFrame, pd.Series)):
        return ("frame", value.to_json(orient="split", double_precision=15, default_handler=repr))
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # a numpy scalar
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__, _plain(dataclasses.asdict(value)))
    if isinstance(value, dict):
        return ("dict", sorted(((_plain(k), _plain(v)) for k, v in value.items()), key=repr))
    if isinstance(value, (set, frozenset)):
        return ("set", sorted((_plain(item) for item in value), key=repr))
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    raise TypeError(f"cannot key a plot on {type(value).__name__}")


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


@drawn_once
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
            color, marker, dashes = styles[variant] if variant not in greyed else GREY_STYLE
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


def label_points(ax, points, fontsize: int = 8, color: str = "black"):
    """Each (x, y, text) point named beside it. The labels are placed when the figure is saved (:func:`save`, by
    :func:`place_labels`), when the layout is final; labels queued first get the nearest free places."""
    queued = ax.__dict__.setdefault("_zoo_labels", [])
    queued.extend((float(x), float(y), str(text), color, fontsize) for x, y, text in points)


LABEL_GAPS = (3, 7, 12, 18, 26, 36, 48, 62, 80, 100, 125, 155)
"""How far from its point (pixels) a label may go, nearest first."""

CROSSING_COST = 30
"""What a line or bar running under a label costs a place, in pixels of distance: a label crosses a line only where
every place free of lines is more than this much farther away."""


def place_labels(fig) -> None:
    """Place the labels queued by :func:`label_points` on each of ``fig``'s axes: each at the nearest place (of 8
    directions at growing distances) that stays inside the axes and covers no marker, no legend and no label placed
    before it, preferring places that no line or bar runs under (a leader line back to its point where it moved).
    Deterministic: the same figure gives the same places. A legend at "best" is fixed where it is first: among the
    data, before the labels join (else it would move to dodge them and land on one)."""
    queued = [(ax, ax.__dict__.pop("_zoo_labels")) for ax in fig.axes if ax.__dict__.get("_zoo_labels")]
    if not queued:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax, labels in queued:
        _place_on(ax, labels, renderer)


def _place_on(ax, labels, renderer) -> None:
    import math

    scale = ax.figure.dpi / 72  # points -> pixels
    frame = ax.bbox
    marks, segments = _obstacles(ax, renderer, scale)
    placed: list[tuple[float, float, float, float]] = []
    for x, y, text, color, fontsize in labels:
        px, py = ax.transData.transform((x, y))
        if not (math.isfinite(px) and math.isfinite(py)):
            continue
        probe = ax.annotate(text, (x, y), xytext=(0, 0), textcoords="offset points", fontsize=fontsize,
                            ha="left", va="bottom")
        extent = probe.get_window_extent(renderer)  # its text where it is drawn (no arrow yet)
        probe.remove()
        dx, dy, width, height = extent.x0 - px, extent.y0 - py, extent.width, extent.height
        best = None
        for order, (gap, left, bottom) in enumerate(_spots(px, py, width, height)):
            box = (left, bottom, left + width, bottom + height)
            if not (frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1):
                continue
            if any(_overlap(box, other) for other in placed) or any(_overlap(box, mark) for mark in marks):
                continue
            crossings = sum(_crosses(box, segment) for segment in segments)
            if gap > LABEL_GAPS[1]:  # its leader line: over another marker or label, it would point at the wrong one
                leader = ((px, py), ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2))
                crossings += sum(_crosses(other, leader) for other in placed + marks
                                 if not (other[0] <= px <= other[2] and other[1] <= py <= other[3]))
            cost = gap + CROSSING_COST * crossings
            if best is None or (cost, order) < best[:2]:
                best = (cost, order, gap, box)
        if best is None:  # nowhere free: beside the point, above every label it would cover
            left, bottom = px + LABEL_GAPS[0], py - height / 2
            while any(_overlap((left, bottom, left + width, bottom + height), other) for other in placed):
                bottom += height
            best = (0, 0, LABEL_GAPS[-1], (left, bottom, left + width, bottom + height))
        _, _, gap, box = best
        moved = gap > LABEL_GAPS[1]
        label = ax.annotate(text, (x, y), xytext=((box[0] - dx - px) / scale, (box[1] - dy - py) / scale),
                            textcoords="offset points", fontsize=fontsize, color=color, ha="left", va="bottom",
                            arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5, shrinkA=0, shrinkB=3)
                            if moved else None)
        label.set_in_layout(False)
        placed.append(box)
        if moved:  # its leader line: a line the next labels keep off
            segments.append(((px, py), ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)))


def _spots(px: float, py: float, width: float, height: float):
    """(distance, left, bottom) of the places a width x height label may take around the point (px, py): to its
    right, left, above, below and the four corners, at each of :data:`LABEL_GAPS`."""
    for gap in LABEL_GAPS:
        corner = gap * 0.7
        yield gap, px + gap, py - height / 2  # right
        yield gap, px - gap - width, py - height / 2  # left
        yield gap, px + corner, py + corner  # above right
        yield gap, px + corner, py - corner - height  # below right
        yield gap, px - corner - width, py + corner  # above left
        yield gap, px - corner - width, py - corner - height  # below left
        yield gap, px - width / 2, py + gap  # above
        yield gap, px - width / 2, py - gap - height  # below


def _obstacles(ax, renderer, scale: float):
    """What a label must not cover on ``ax``, in pixels: the boxes of its markers and legend, and the segments of
    its lines and bars (which a label may cross, at a cost)."""
    import numpy as np
    from matplotlib.cbook import STEP_LOOKUP_MAP
    from matplotlib.collections import LineCollection, PathCollection

    marks, segments = [], []

    def mark(points, radius):
        for (mx, my), r in zip(points, radius):
            if np.isfinite(mx) and np.isfinite(my):
                marks.append((mx - r - 1, my - r - 1, mx + r + 1, my + r + 1))

    def run(points):
        points = [tuple(p) for p in points if np.all(np.isfinite(p))]
        segments.extend(zip(points, points[1:]))

    for collection in ax.collections:
        if isinstance(collection, PathCollection) and len(collection.get_offsets()):
            offsets = collection.get_offset_transform().transform(collection.get_offsets())
            sizes = collection.get_sizes() if len(collection.get_sizes()) else np.array([36.0])
            mark(offsets, np.resize(np.sqrt(sizes) / 2 * scale, len(offsets)))
        elif isinstance(collection, LineCollection):
            for segment in collection.get_segments():
                run(collection.get_transform().transform(segment) if len(segment) else [])
    for line in ax.lines:
        xy = line.get_xydata()
        if not len(xy):
            continue
        pixels = line.get_transform().transform(xy)
        if line.get_linestyle() not in ("None", "", " "):
            run(np.column_stack(STEP_LOOKUP_MAP[line.get_drawstyle()](*pixels.T)))
        if line.get_marker() not in (None, "None", "", " ", ","):
            mark(pixels, [line.get_markersize() / 2 * scale] * len(pixels))
    legend = ax.get_legend()
    if legend is not None:
        box = legend.get_window_extent(renderer)
        marks.append((box.x0, box.y0, box.x1, box.y1))
        anchor = legend.get_bbox_to_anchor()
        if anchor.bounds == ax.bbox.bounds:  # inside the axes, where "best" put it: kept there
            legend.set_loc(tuple(ax.transAxes.inverted().transform((box.x0, box.y0))))
    return marks, segments


def _overlap(a, b) -> bool:
    """Whether boxes (x0, y0, x1, y1) overlap."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _crosses(box, segment) -> bool:
    """Whether the segment ((x0, y0), (x1, y1)) runs through the box (x0, y0, x1, y1) (Liang-Barsky clipping)."""
    (x0, y0), (x1, y1) = segment
    dx, dy = x1 - x0, y1 - y0
    low, high = 0.0, 1.0
    for p, q in ((-dx, x0 - box[0]), (dx, box[2] - x0), (-dy, y0 - box[1]), (dy, box[3] - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            low = max(low, t)
        else:
            high = min(high, t)
        if low > high:
            return False
    return True


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
