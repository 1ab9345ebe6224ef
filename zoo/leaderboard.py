"""The board writer: README.md, index.html, results.csv and the plots of one run, from the store.

It knows no suite: the ranked tables come from :mod:`zoo.ranking` (the gate, each suite's columns, the ranking
suite's figure), and every suite with rows on the board adds its own section (:class:`zoo.Section`, or a
generic one of its rows). Every figure comes from the run's rows; nothing is typed by hand. Text that came
from plugins is escaped so it cannot break the Markdown tables or inject markup.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import fields
from pathlib import Path

import pandas as pd

from . import plots as plots_, webpage
from .board import KIND_TITLES, Board, board_group, cell, markdown_table, origin_text
from .checks import MEASURED
from .contract import Target
from .environment import COMPARABLE_ENVIRONMENT, machine_kind
from .export import EXPORT
from .folder import BoardFolder
from .ranking import (advice, ceilings, gate_sentence, keeps, ranked_axes, ranked_tables, stale_lines, standing_text,
                      ties, unranked_lines, why_unranked)
from .store import RESULT_COLUMNS, Store, device_kind
from .suite import Section, Suite, generic_section, upgrade_name

TAG_LABELS = {
    "accepts_attn_mask": "mask", "supports_causal": "causal", "causal_only": "causal only",
    "allows_different_lengths": "q_len != k_len",
    "allows_kv_dims": "kdim/vdim", "key_order_invariant": "key-order invariant",
    "has_parameters": "parameters",
}


def registered_suites() -> dict[str, Suite]:
    """The suites of the default registry: what draws a board that was not given its suites."""
    from .api import default_registry

    return default_registry().suites


def render(store: Store, run_id: str, out_dir: Path, keep_runs: bool = False,
           suites: dict[str, Suite] | None = None, held_back: str | None = None,
           held_runs: dict[str, str] | None = None, read_from: BoardFolder | None = None,
           board: Board | None = None) -> list[Path]:
    """Write the board for ``run_id`` into ``out_dir`` as a whole (:func:`board_files`); ``keep_runs`` (``store``
    is the folder's own database): with the export of every run it holds; ``held_back``: why this run's board is
    not the folder's (said at its top); ``held_runs``: :func:`board_run`'s held-back runs, where the caller has
    them; ``read_from``: the folder ``store`` was read from (:meth:`BoardFolder.for_reading`), whose runs must not
    have been published anew since (:class:`~zoo.folder.RunsChanged`); ``board``: that board
    (:func:`board_of`), where the caller has it. Returns the paths, README.md first."""
    files = board_files(store, run_id, out_dir, suites, held_back, held_runs, board)
    stale = [p.name for p in Path(out_dir).glob("*.png") if p.name not in files]  # plots an earlier board drew
    folder = read_from or BoardFolder(out_dir)
    return folder.publish(files, store=store if keep_runs else None, remove=stale, as_read=read_from is not None)


def board_of(store: Store, run_id: str, suites: dict[str, Suite], folder: Path,
             held_runs: dict[str, str] | None = None) -> Board:
    """The board of ``run_id`` in ``folder``, without the rows of runs held back from it (``held_runs``:
    :func:`board_run`'s, where the caller has them; else found here)."""
    held_runs = board_run(store, suites)[1] if held_runs is None else held_runs
    return Board.of(store, run_id, suites, folder=typed_folder(folder), exclude=frozenset(held_runs) - {run_id})


def board_files(store: Store, run_id: str, out_dir: Path, suites: dict[str, Suite] | None = None,
                held_back: str | None = None, held_runs: dict[str, str] | None = None,
                board: Board | None = None) -> dict[str, bytes]:
    """The board for ``run_id`` as file name -> content: README.md, index.html, results.csv and the sections'
    plots (``board``: the board of that run, where the caller has it). Only the plots of boards published in
    ``out_dir``'s subfolders are read from disk."""
    suites = registered_suites() if suites is None else suites
    if board is None:
        board = board_of(store, run_id, suites, Path(out_dir).parent if held_back else out_dir, held_runs)
    board.environment = {**board.environment, **_ran_on(board.jobs),
                         **({"held back": f"this run did not replace its folder's board: {held_back}"} if held_back else {})}
    results = pd.concat([board.results, *[rows.assign(reruns=0, between_runs=float("nan"))
                                          for rows in board.carried.values()]], ignore_index=True)
    tidy = results.assign(plugin=results.variant.map(lambda v: board.cards[v].get("plugin")),
                          origin=results.variant.map(lambda v: origin_text(board.cards[v])),
                          params=results.params.map(lambda p: json.dumps(p, sort_keys=True) if p else None))
    if "timing_form" not in tidy:  # a board whose rows carry no run's form
        tidy = tidy.assign(timing_form=None)
    csv = tidy[["run_id", *RESULT_COLUMNS, "plugin", "origin", "source_sha256", "timing_form", "reruns",
                "between_runs"]].sort_values(
        ["variant", "suite", "check", "versus", "mode", "phase", "n", "batch"], kind="stable").to_csv(index=False)
    tables, unranked = ranked_tables(board)
    with plots_.reusing(out_dir):
        sections = [_section(board, name) for name in board.suite_order()]
    sections = [section for section in sections if section is not None]
    plots = {name: _as_drawn_before(Path(out_dir) / name, png) for section in sections
             for name, png in section.plots.items()}
    figures = [(png, name.removesuffix(".png")) for name, png in plots.items()] + _sub_board_plots(Path(out_dir))
    answers = advice(board, tables)
    readme = _readme(board, tables, answers, unranked, sections, list(plots))
    page = webpage.page(_page_data(board, tables, answers, unranked, sections), figures)
    text = {"README.md": readme, "index.html": page, "results.csv": csv}  # a plugin's lone surrogate becomes "?"
    return {**{name: content.encode("utf-8", "replace") for name, content in text.items()}, **plots}


PIXEL_SLACK = (4, 1e-4)
"""What two drawings of the same figure may differ by (the largest step of a pixel's channel, of 255, and the share
of pixels that differ at all): the same figures drawn on an Intel Xeon (AVX-512) and on an AMD EPYC box (no AVX-512)
came out with 3 of 630,000 pixels a level apart, floating-point rounding that differs with the machine."""


def _as_drawn_before(path: Path, png: bytes) -> bytes:
    """The plot already in the folder where it is ``png`` redrawn (within :data:`PIXEL_SLACK`) from the same inputs
    (:func:`zoo.plots.drawn_once`), else ``png``: a board rendered again from the same runs is byte-identical on any
    machine, so nothing in git changes."""
    import io

    import numpy as np
    from PIL import Image

    try:
        old = path.read_bytes()
        if old == png:
            return old
        images = [Image.open(io.BytesIO(data)) for data in (old, png)]
        if len({image.text.get(plots_.INPUTS_KEY) for image in images}) > 1:  # other inputs, or other code
            return png
        before, after = (np.asarray(image.convert("RGBA"), dtype=np.int16) for image in images)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):  # none there, or not a picture
        return png
    if before.shape != after.shape:
        return png
    step = np.abs(before - after).max(axis=-1)
    largest, share = PIXEL_SLACK
    return old if step.max() <= largest and np.count_nonzero(step) <= share * step.size else png


def typed_folder(out_dir: Path) -> str:
    """``out_dir`` as a reader types it in a command: relative to the working directory when inside it."""
    path = Path(out_dir).absolute()
    try:
        return str(path.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(path)


def _section(board: Board, name: str) -> Section | None:
    suite = board.suite(name)
    return suite.section(board) if suite.section else generic_section(suite, board)


def _sub_board_plots(out_dir: Path) -> list[tuple[bytes, str]]:
    """The plots of boards published in subfolders (the long-sequence board), shown on this board's page."""
    figures = []
    for folder in sorted(p for p in out_dir.iterdir() if p.is_dir() and (p / EXPORT).is_file()) if out_dir.is_dir() else []:
        for name, png in BoardFolder(folder).published("*.png").items():
            figures.append((png, f"{name.removesuffix('.png')} (from {folder.name}/, a board of its own run: "
                                 f"{folder.name}/index.html)"))
    return figures


HELD_BACK_FACTOR = 3.0  # a run whose median (or 90th-percentile) cell spread is this many times the board's...
HELD_BACK_FLOOR = 0.1  # ...and above this (a relative spread), is held back instead of written over the board
HELD_BACK_QUANTILES = (0.5, 0.9)  # the median: a machine busy throughout; the 90th percentile: busy for part of a
# run (a quick run-all beside a test suite: median 0.04, as quiet as the board's 0.055, 90th percentile 1.02 against
# 0.13-0.16 in three idle runs, 36 of 162 cells noisy against 3-6)
HELD_BACK_FOLDER = "held-back"  # where a held-back run's own board is written, inside the board's folder


def run_noise(store: Store, run_id: str, suites: dict[str, Suite]) -> pd.Series:
    """The relative spread of every cell ``run_id`` timed, from each suite that says what its noise is."""
    noisy = {name: suite for name, suite in suites.items() if suite.noise is not None}
    rows = store.results(run_id, noisy)  # only theirs: a board's runs hold far more rows of the other suites
    parts = [suite.noise(rows[rows.suite == name]) for name, suite in noisy.items()]
    parts = [part for part in parts if len(part)]
    return pd.concat(parts) if parts else pd.Series(dtype=float)


def held_back_reason(new: pd.Series, board: pd.Series, against: str = "the board's") -> str | None:
    """Why a run with cell spreads ``new`` must not replace a board whose run had ``board`` (None: it may): over the
    cells both timed (else all of each), its median or its 90th-percentile spread (:data:`HELD_BACK_QUANTILES`) is
    above HELD_BACK_FLOOR and HELD_BACK_FACTOR times the board's (``against`` names the other side in the
    sentence)."""
    if new.empty or board.empty:
        return None
    common = new.index.intersection(board.index)
    mine, theirs = (new[common], board[common]) if len(common) else (new, board)
    for quantile in HELD_BACK_QUANTILES:
        a, b = float(mine.quantile(quantile)), float(theirs.quantile(quantile))
        if a > HELD_BACK_FLOOR and a > HELD_BACK_FACTOR * b:
            which = "median" if quantile == 0.5 else f"{quantile * 100:.0f}th percentile of"
            return (f"its timings spread {a:.3g} ({which} IQR/median over {len(mine)} cells), "
                    f"{a / max(b, 1e-12):.1f}x {against} {b:.3g}: held back above {HELD_BACK_FACTOR:g}x and "
                    f"{HELD_BACK_FLOOR:g}")
    return None


def board_run(store: Store, suites: dict[str, Suite] | None = None) -> tuple[str | None, dict[str, str]]:
    """The run a folder's board shows, and the runs held back (run -> why). Runs are taken in the order they
    started; each replaces the board unless its timings are far noisier (:func:`held_back_reason`) than the
    board's cells, or it ran on another kind of machine and did not measure every variant the board's machine did
    (:func:`narrower_reason`): a busy machine, or one variant run on another machine, never writes over a board, and
    the held-back run stays in the store (``zoo leaderboard --run`` publishes it). The board's cells a run is judged
    against: each cell's spread in the latest run not held back that timed it, among the runs of its own settings
    and machine (a run of one variant does not make a whole run-all the reference's cells); where those timed
    nothing and for a run on another kind of machine than the board's (a fresh clone's first run-all), among every
    run not held back. Runs of other settings on the board's machine are not judged by runs of other settings: a
    board's own runs differ in the suites they set (the long board's speed and quality runs), a settings change
    changes how a spread is measured, and each suite's rows are matched by that suite's settings."""
    from .api import default_registry

    suites = registered_suites() if suites is None else suites
    registered = set(default_registry().list_variants())
    shown, shown_machine, reference, held, covered = None, None, {}, {}, {}
    board = pd.Series(dtype=float)  # every cell's spread in the latest run not held back that timed it
    for run in store.runs().run_id:
        noise = run_noise(store, run, suites)
        group, machine = board_group(store, run), machine_kind(store.environment(run))
        own = reference.get(group, pd.Series(dtype=float))
        elsewhere = shown is not None and machine != shown_machine
        against = (own, "the board's") if not own.empty else (
            (board, "the board's (measured on another kind of machine)" if elsewhere else "the board's")
            if elsewhere or group in reference else None)
        if against is not None and (why := held_back_reason(noise, *against)):
            held[run] = why
            continue
        measured = set(store.jobs(run).variant)
        if elsewhere and (why := narrower_reason(store, run, shown, measured, covered[shown_machine] & registered)):
            held[run] = why
            continue
        covered[machine] = covered.get(machine, set()) | measured
        if not noise.empty:
            reference[group] = noise.combine_first(own)
            board = noise.combine_first(board)
        else:
            reference.setdefault(group, own)
        shown, shown_machine = run, machine
    return shown, held


def narrower_reason(store: Store, run: str, shown: str, measured: set[str], board_variants: set[str]) -> str | None:
    """Why ``run``, from another kind of machine than run ``shown`` that the board shows, must not replace it (None:
    it may): it measured ``measured``, not every one of ``board_variants`` (the registered variants the board's
    machine measured), so the board it would turn to would show the others from that machine's older runs, or not
    at all."""
    if not (missing := board_variants - measured):
        return None
    mine, theirs = store.environment(run), store.environment(shown)
    differs = [f"{key} {mine.get(key)}, the board's {theirs.get(key)}" for key in COMPARABLE_ENVIRONMENT
               if str(mine.get(key)) != str(theirs.get(key))]
    return (f"it ran on another kind of machine ({'; '.join(differs)}) and measured {len(board_variants & measured)} "
            f"of this board's {len(board_variants)} variants (not {', '.join(sorted(missing)[:3])}"
            f"{', ...' if len(missing) > 3 else ''}): measure them on the board's kind of machine, or all of them "
            "here (zoo run-all) to make the board this machine's")


def shown_runs(store: Store, suites: dict[str, Suite] | None = None) -> set[str]:
    """The runs some board shows: for each group of comparable runs (same settings, same kind of machine), what
    the board of its latest run not held back shows, and what each held-back run's own board shows (``zoo prune
    --unshown`` removes the others)."""
    suites = registered_suites() if suites is None else suites
    held = board_run(store, suites)[1]
    latest = {}
    for run in store.runs().run_id:  # in the order they started: the last of a group wins
        if run not in held:
            latest[board_group(store, run)] = run
    shown = set()
    for run in {*latest.values(), *held}:
        board = Board.of(store, run, suites, exclude=frozenset(held) - {run})
        shown |= {run} | set(board.results.run_id) | {r for rows in board.carried.values() for r in rows.run_id}
    return shown


# --- README.md -------------------------------------------------------------------------------------------


def _readme(board: Board, tables, answers, unranked, sections: list[Section], plots: list[str]) -> str:
    lines = [
        "# Attention zoo leaderboard",
        "",
        "Generated by `zoo run-all` from the run below; do not edit by hand (`zoo leaderboard` re-renders it). "
        + _accumulated_text(board),
        "",
        markdown_table(pd.DataFrame([{"": k, "value": v} for k, v in {"run": board.run_id, **board.environment}.items()])),
        "",
        *_advice_lines(answers, _advice_intro(board, tables)),
        "## Leaderboard",
        "",
        *[line for paragraph in _intro(board) for line in (paragraph, "")],
    ]
    for kind, ranked in tables.items():
        lines += [f"### {KIND_TITLES[kind]}", "", markdown_table(ranked), ""]
    lines += board.notes.lines()
    lines += unranked_lines(board, unranked)
    lines += stale_lines(board)
    lines += ["## Capabilities", "", markdown_table(_capabilities(board)), ""]
    lines += _departures_section(board)
    for section in sections:
        lines += _section_lines(section)
    lines += _targets_section(board)
    if plots:
        lines += ["## Plots", ""] + [f"![{name.removesuffix('.png')}]({name})" for name in plots] + [""]
    return "\n".join(lines)


ADVICE_INTRO = ("Computed from this board's ranked variants (none typed by hand): for each use, the best exact variant "
                "and, when an approximation beats it there, that one too, each with what it costs (the figures it "
                "trails its kind's top value on). \"Exact\" means the variant computes its own documented function "
                "exactly, not necessarily softmax: what that function gives up shows in its quality. Each variant's "
                "place on the Pareto front of every figure is in the tables below.")


def _measured_on(board: Board, tables) -> str:
    """Whom the answers choose among and where they were measured: ' They choose among this board's 20 ranked
    variants (...), as measured on AMD EPYC (cpu, 2 threads, float32): another machine, ...'."""
    ranked, env = sum(map(len, tables.values())), board.environment
    where = ", ".join(str(env[k]) + (" threads" if k == "threads" else "") for k in ("device", "threads") if env.get(k))
    return (f" They choose among this board's {ranked} ranked variants (a variant it has not ranked is not weighed), "
            f"as measured on {env.get('cpu') or 'this machine'} ({where}, {board.settings.get('dtype', 'float32')}): "
            "another machine, a GPU above all, may order them differently.")


def _advice_intro(board: Board, tables) -> str:
    """The paragraph before the answers: how they are chosen, among whom, where measured, ceilings and ties."""
    axes = ranked_axes(board, tables)
    limits, equal, kept = ceilings(axes), ties(axes), keeps(axes)
    held = (f" A variant is offered only within these ceilings, whatever its speed: {'; '.join(limits)} (measured: "
            "an approximation whose error is unknown is not offered either).") if limits else ""
    held += (f" For a reader who will not give up more, each answer also names the best variant keeping "
             f"{'; '.join(kept)}, when that is another.") if kept else ""
    tied = (f" Figures this close count as equal, here and on the Pareto front (their noise): {'; '.join(equal)}; "
            "a pick names the variants tied with it on its figure.") if equal else ""
    return ADVICE_INTRO + _measured_on(board, tables) + held + tied


def _advice_lines(answers, intro: str) -> list[str]:
    return ["## Which should I use?", "", intro, "", *[f"- {cell(a.sentence())}" for a in answers], ""] \
        if answers else []


def _intro(board: Board) -> list[str]:
    """What the ranking compares: the gate, then the ranking suite's own paragraphs."""
    suite = board.ranking_suite
    paragraphs = suite.ranking.intro(board) if suite else ["No registered suite ranks variants: they are listed."]
    return [f"{gate_sentence(board)} {paragraphs[0]}", *paragraphs[1:]]


def _section_lines(section: Section) -> list[str]:
    lines = [f"## {section.title}", ""]
    for paragraph in section.text:
        lines += [paragraph, ""]
    for table in section.tables:
        if table.title:
            lines += [f"### {table.title}", ""]
        for paragraph in table.note:
            lines += [paragraph, ""]
        lines += [markdown_table(pd.DataFrame(table.rows, columns=table.columns or None)), ""]
        if table.footnotes:
            lines += ["Empty cells:", "", *[f"{i}. {cell(r)}" for i, r in enumerate(table.footnotes, 1)], ""]
    return lines


def _accumulated_text(board: Board) -> str:
    others = sorted(set(board.results.run_id) - {board.run_id})

    def carried(runs: str) -> str:
        return "".join(f" A variant's {name} rows that {runs} did not measure on its current source are its latest of "
                       f"that source from any run (the {name} section names them)." for name in sorted(board.carried))

    if not others:
        return "Every figure is from this run." if not board.carried else \
            f"Every figure but the {' and '.join(sorted(board.carried))} rows is from this run." + carried("this run")
    kept = sorted(set(board.results[board.results.run_id != board.run_id].variant))
    runs = f"run {others[0]}" if len(others) == 1 else f"{len(others)} runs, from {others[0]} to {others[-1]}"
    return (f"This run's results, and for what it did not run the latest results of earlier runs with the same "
            f"settings (of that suite and of the run as a whole) on the same kind of machine ({runs}; for "
            f"{len(kept)} variant(s)); the *from* column says which runs each ranked row comes from."
            + carried("these runs"))


def _capabilities(board: Board) -> list[dict]:
    return [{"variant": variant, "approximates": _approximates_text(board, variant),
             **{label: "yes" if board.card(variant).get("tags", {}).get(tag) else "-" for tag, label in TAG_LABELS.items()},
             "decodes": _decoding_text(board.card(variant))}
            for variant in board.variants]


def _departures_section(board: Board) -> list[str]:
    """What each variant changes from the paper it cites, as its plugin states it: the checks compare a variant
    with its own reference, so they cannot see this."""
    from .contract import DEPARTURE_KINDS

    rows, unrecorded, none = [], [], []
    for variant in board.variants:
        departures = _departures(board.card(variant))
        if departures is None:
            unrecorded.append(variant)
        elif not departures:
            none.append(variant)
        else:
            rows += [{"variant": variant, "kind": d["kind"], "departure from the cited paper": d["text"]} for d in departures]
    kinds = "; ".join(f"*{kind}*: {meaning}" for kind, meaning in DEPARTURE_KINDS.items())
    return ["## Departures from the papers", "",
            f"What each implementation changes from the paper it cites, as its plugin states it ({kinds}). The "
            "correctness checks compare a variant with its own reference, so they cannot see these.", "",
            markdown_table(pd.DataFrame(rows, columns=["variant", "kind", "departure from the cited paper"])), "",
            *([f"None stated (it follows the paper as written): {', '.join(none)}.", ""] if none else []),
            *([f"Not recorded by their runs (stored before plugins stated departures): {', '.join(unrecorded)}.", ""]
              if unrecorded else [])]


def _departures(card: dict) -> list[dict] | None:
    """The card's departures as {kind, text} records, or None where its run did not record them."""
    recorded = card.get("departures")
    if not isinstance(recorded, list):
        return None
    return [{"kind": str(d.get("kind", "")), "text": str(d.get("text", ""))} for d in recorded if isinstance(d, dict)]


def _decoding_text(card: dict) -> str:
    """How the variant decodes token by token (its state's growth), or why it does not; a run stored before
    decoding was a capability says nothing."""
    if card.get("decoder_context"):
        return "yes: its context's keys and values, fixed while it decodes"
    if card.get("decoder_growth"):
        return {"token": "yes: a cache per token", "window": "yes: a cache up to its window",
                "fixed": "yes: a fixed-size state"}.get(card["decoder_growth"], f"yes ({card['decoder_growth']})")
    return f"- ({card['decoder_absent']})" if card.get("decoder_absent") else "not recorded"


def _approximates_text(board: Board, variant: str) -> str:
    from .board import approximates

    return approximates(board.card(variant)) or "- (exact)"


def _targets_section(board: Board) -> list[str]:
    return ["## Targets the plugins set themselves", "",
            "Declared by each plugin (`zoo.Target`) and judged here against this run's rows. "
            "Lengths beyond the profile's are not measured: run `--profile full` for those. A figure with an interval "
            "(times and ratios: every process's median) is judged by all of it: *met* where the whole interval meets the "
            "goal, *not met* where the whole interval misses it, *within noise* where it spans the goal (a rerun could "
            "land on either side).", "",
            markdown_table(_target_rows(board)), ""]


def _target_rows(board: Board) -> list[dict]:
    measured_kinds = {measure.name for suite in board.suites.values() for measure in suite.measures} | set(
        board.results.check)  # a suite that declares no measures: the kinds its rows name
    rows = []
    for variant in board.variants:
        results = board.rows(variant=variant)
        for recorded in board.card(variant).get("targets", []):
            target = Target(**{f.name: recorded[f.name] for f in fields(Target) if f.name in recorded})
            # a target an older zoo recorded names its row as that zoo named it ("x-torch-sdpa")
            check, versus = (target.check, target.versus) if "versus" in recorded else upgrade_name(target.check,
                                                                                                    board.suites)
            sel = results[(results.check == check) & (results.versus == versus) & (results["mode"] == target.mode)
                          & (results.phase == target.phase)].dropna(subset=["value"])
            if target.n is not None:
                sel = sel[sel.n == target.n]
            if target.batch is not None:
                sel = sel[sel.batch == target.batch] if "batch" in sel else sel.iloc[:0]
            if sel.empty:
                verdict, measured = ("not measured in this run" if check in measured_kinds else
                                     f"never measured: no suite on this board measures {check!r}"), ""
            else:
                verdict = _verdict(target, [_interval(r) for r in sel.itertuples()])
                measured = ", ".join(f"n={int(r.n)}" + (f" batch {int(r.batch)}" if pd.notna(getattr(r, "batch", None))
                                                         and target.batch is None else "")
                                     + f": {r.value:.3g}" + _interval_text(r) for r in sel.itertuples())
            where = (f"n={target.n}" if target.n is not None else "every timed n") + (
                f", batch {target.batch}" if target.batch is not None else "")
            measure = f"{check} vs {versus}" if versus else check
            rows.append({"variant": variant, "target": target.note, "measure": measure,
                         "where": f"{target.mode} {target.phase}, {where}", "goal": target.bound(),
                         "measured": measured, "verdict": verdict})
    return rows


def _interval(row) -> tuple[float, float, float]:
    """A figure's value and the ends of its stated interval (the value itself where it states none)."""
    low, high = getattr(row, "low", None), getattr(row, "high", None)
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return row.value, row.value, row.value
    return row.value, min(low, row.value), max(high, row.value)


def _interval_text(row) -> str:
    _, low, high = _interval(row)
    return f" [{low:.3g}-{high:.3g}]" if low < high else ""


def _verdict(target: Target, figures: list[tuple[float, float, float]]) -> str:
    """Met where every figure's whole interval meets the goal, not met where one's whole interval misses it, else
    within noise: a rerun lands anywhere in a figure's interval (zoo.timing), so a verdict its interval straddles
    could flip between two runs, and the board says so instead of picking a side."""
    if all(target.met_by(low) and target.met_by(high) for _, low, high in figures):
        return "met"
    if any(target.missed_by(low, high) for _, low, high in figures):
        return "not met"
    return "within noise"


# --- index.html --------------------------------------------------------------------------------------------


def _page_data(board: Board, tables, answers, unranked, sections: list[Section]) -> dict:
    """What index.html shows: the ranked tables, why the others are not ranked, the suites' sections and each
    variant's page."""
    targets = _target_rows(board)
    return {
        "run": board.run_id, "environment": {k: str(v) for k, v in board.environment.items()},
        "intro": _intro(board)[0], "advice": [a.sentence() for a in answers],
        "advice_intro": _advice_intro(board, tables) if answers else "",
        "groups": [{"kind": kind, "title": KIND_TITLES[kind], "columns": list(rows[0]) if rows else [], "rows": rows}
                   for kind, rows in tables.items()],
        "notes": board.notes.reasons, "capabilities": list(TAG_LABELS.values()),
        "unranked": [{"variant": v, "why": why_unranked(board, v)} for v in unranked],
        "stale": [{"variant": v, "suites": ", ".join(f"{suite} (run {', '.join(runs)})" for suite, runs in found.items()),
                   "command": board.refresh_command(v, list(found))} for v in board.variants if (found := board.stale(v))],
        "sections": [{"title": s.title, "text": s.text,
                      "tables": [{"title": t.title, "note": t.note, "columns": _columns(t), "rows": t.rows,
                                  "footnotes": t.footnotes} for t in s.tables]} for s in sections],
        "variants": {v: _variant_page(board, v, [t for t in targets if t["variant"] == v]) for v in board.variants},
    }


def _columns(table) -> list[str]:
    return list(table.columns) or list(dict.fromkeys(key for row in table.rows for key in row))


def _variant_page(board: Board, variant: str, targets: list[dict]) -> dict:
    from .board import approximates

    card, provenance = board.card(variant), board.cards[variant]
    mine = board.rows(variant=variant)
    checks = mine[mine.status != MEASURED]
    details = [table for name in board.suite_order() if board.suite(name).details
               for table in board.suite(name).details(board, variant)]
    return {
        "summary": card.get("summary", ""), "citation": card.get("citation", ""), "kind": board.kind(variant),
        "family": card.get("family"), "approximates": approximates(card),
        "capabilities": {label: bool(card.get("tags", {}).get(tag)) for tag, label in TAG_LABELS.items()},
        "departures": _departures(card),
        "options": _options_text(card),
        "standing": "ranked" if board.ranked(variant) else "not ranked: " + why_unranked(board, variant),
        "stale": [{"suite": suite, "runs": ", ".join(runs), "command": board.refresh_command(variant, [suite])}
                  for suite, runs in board.stale(variant).items()],
        "details": [{"title": t.title, "columns": _columns(t), "rows": t.rows} for t in details],
        "checks": [{"suite": r.suite, "check": f"{r.check} vs {r.versus}" if r.versus else r.check,
                    "setting": r.setting or "", "status": r.status,
                    "detail": "" if pd.isna(r.detail) else r.detail} for r in checks.itertuples()],
        "targets": [{k: t[k] for k in ("target", "where", "goal", "measured", "verdict")} for t in targets],
        "provenance": {"origin": origin_text(provenance), "runs": ", ".join(sorted(set(mine.run_id))),
                       **{k: str(v) for k, v in provenance.items() if k != "card" and not isinstance(v, (dict, list))}},
    }


def _options_text(card: dict) -> dict[str, str]:
    """Each option's value as measured, and the value the quality suite trained with where the plugin gives
    another (its quality options: a window the tasks' short sequences would not reach otherwise)."""
    trained = card.get("quality_options") or {}
    return {str(k): str(v) + (f" (the quality suite trains with {trained[k]})" if k in trained else "")
            for k, v in (card.get("options") or {}).items()}


def _ran_on(jobs: pd.DataFrame) -> dict[str, str]:
    """Where the jobs ran, as recorded by each job: the machine(s) and device, with job counts."""
    places = Counter(f"{p['ran_on'].get('host')}, {device_kind(p['ran_on'])}"
                     for p in jobs.provenance if p.get("ran_on"))
    return {"ran on": "; ".join(f"{place} ({count} of the board's jobs, its earlier runs' included)"
                                for place, count in sorted(places.items()))} if places else {}


# --- by device ---------------------------------------------------------------------------------------------


def render_by_device(store: Store, out_dir: Path, suites: dict[str, Suite] | None = None) -> tuple[Path, int]:
    """One leaderboard per device kind (the latest run of each) in its own folder, and an index that
    compares the kinds side by side: each variant's ranking figure, and why it is not ranked, on each."""
    suites = registered_suites() if suites is None else suites
    latest: dict[str, str] = {}
    for run in store.runs().itertuples():  # ordered by start, so the last one wins
        latest[" + ".join(store.device_kinds(run.run_id))] = run.run_id
    links, columns, headers = [], {}, set()
    for kind, run_id in sorted(latest.items()):
        folder = out_dir / (re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "device")
        render(store, run_id, folder, suites=suites)
        links.append(f"- [{cell(kind)}]({folder.name}/README.md): run {run_id}")
        board = Board.of(store, run_id, suites)
        column = {}
        for variant in board.variants:
            figure, why = board.rank_figure(variant), standing_text(board.standings[variant], board.required_suites())
            if figure is not None:
                headers.add(figure.column)
            column[variant] = " ".join(filter(None, [figure.text if figure else "", why and f"(unranked: {why})"]))
        columns[kind] = column
    comparison = pd.DataFrame(columns).rename_axis("variant").reset_index() if columns else pd.DataFrame()
    lines = ["# Leaderboards by device", "",
             "Generated by `zoo leaderboard --by device`: the latest run of each device kind.", "", *links, "",
             "## Side by side", "",
             f"Each variant's ranking figure on each kind of device ({'; '.join(sorted(headers)) or 'none'}; lower is "
             "better): ratios to an op measured on the same device, so devices of different speeds compare.", "",
             markdown_table(comparison.fillna("not run")), ""]
    [index] = BoardFolder(out_dir).publish({"README.md": "\n".join(lines).encode()})
    return index, len(latest)


def summary(store: Store, run_id: str, suites: dict[str, Suite], out_dir: Path,
            held_runs: dict[str, str] | None = None, board: Board | None = None) -> tuple[list[dict], list[str]]:
    """What a run ends with on the terminal, from its board in ``out_dir``: per variant its kind, the gate and
    its ranking figure; and a line per variant with rows of an older source left off, with its refresh command
    (``held_runs``: :func:`board_run`'s held-back runs, where the caller has them; ``board``: the run's board, where
    the caller has it)."""
    if board is None:
        board = board_of(store, run_id, suites, out_dir, held_runs)
    rows = []
    for variant in board.variants:
        figure = board.rank_figure(variant)
        rows.append({"variant": variant, "kind": board.kind(variant),
                     "ranking gate": standing_text(board.standings[variant], board.required_suites()) or "passed",
                     "ranked by": f"{figure.text} ({figure.column})" if figure else "-"})
    stale = [f"{variant}: {', '.join(found)} rows of an older source left off the board; measure them again with: "
             f"{board.refresh_command(variant, list(found))}" for variant in board.variants if (found := board.stale(variant))]
    return rows, stale

