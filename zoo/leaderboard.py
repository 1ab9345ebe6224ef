"""The leaderboard writer: README.md, results.csv and log-log plots, rendered from one run in the store.

Every figure comes from the run's rows; nothing is typed by hand. Text that came from plugins is
escaped so it cannot break the Markdown tables or inject markup.
"""

from __future__ import annotations

import html
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import tabulate

from .checks import BAD, ERROR, FAILED, MEASURED, PASSED, SKIPPED
from . import webpage
from .environment import COMPARABLE_ENVIRONMENT
from .folder import BoardFolder
from .store import RESULT_COLUMNS, Store, device_kind
from .contract import COMPARATOR_LABELS, COMPARATORS, SDPA, Target

RANK_MODE, RANK_PHASE = "full", "fwd+bwd"
PLOT_FILES = ("time.png", "flops.png", "memory.png", "accuracy-vs-speed.png", "recall-vs-pairs.png")
LONG_SEQUENCES = "long-sequences"  # the long-sequence board's folder inside the published leaderboard/
KIND_TITLES = {"core": "Attention cores (no parameters)", "layer": "Attention layers (with projections)"}
TAG_LABELS = {
    "accepts_attn_mask": "mask", "supports_causal": "causal", "allows_different_lengths": "q_len != k_len",
    "allows_kv_dims": "kdim/vdim", "key_order_invariant": "key-order invariant",
    "has_parameters": "parameters",
}


CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def cell(value) -> str:
    """Plugin text made safe for a Markdown table cell and any HTML renderer."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    text = CONTROL_CHARACTERS.sub("\ufffd", " ".join(str(value).split()))  # NUL, ESC: no terminal tricks
    return (html.escape(text, quote=False).replace("|", "&#124;").replace("`", "&#96;")
            .replace("](", "&#93;("))  # no link or image of a plugin's making (footnote marks [1] stay)


def _table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_(none)_"
    safe = frame.map(lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else cell(v))
    safe.columns = [cell(column) for column in safe.columns]  # headers can be plugin text too (task names)
    return tabulate(safe, headers="keys", tablefmt="github", showindex=False, floatfmt=".3g")


def _value(results: pd.DataFrame, variant: str, check: str, mode: str, phase: str, n=None):
    rows = results[(results.variant == variant) & (results.check == check) & (results["mode"] == mode)
                   & (results.phase == phase)]
    if n is not None:
        rows = rows[rows.n == n]
    rows = rows.dropna(subset=["value"])
    return None if rows.empty else float(rows.value.iloc[-1])


@dataclass
class Standing:
    """Whether a variant may be ranked: its correctness suite ran on the code that was measured, and
    nothing failed."""

    checked: bool
    reasons: list[str] = field(default_factory=list)  # failing correctness checks, and errors in any suite

    @property
    def ranked(self) -> bool:
        return self.checked and not self.reasons


def gate(results: pd.DataFrame) -> dict[str, Standing]:
    """Per variant: did the correctness suite run on it, and which checks failed or erred (correctness
    failures; errors anywhere, such as NaN outputs in the speed suite or a crashed worker). Rows from
    several runs (:func:`board_rows`) must all come from the same version of the variant's source."""
    standings: dict[str, Standing] = {}
    for variant, rows in results.groupby("variant"):
        bad = rows[rows.status.isin(BAD) & ((rows.suite == "correctness") | (rows.status == ERROR))]
        checked = bool(((rows.suite == "correctness") & (rows.status == PASSED)).any())
        reasons = [f"{r.suite}/{r.check}: {r.detail or r.status}" + (f" [{r.setting}]" if r.setting else "")
                   for r in bad.itertuples()]
        if "source_sha256" in rows and rows.source_sha256.dropna().nunique() > 1:
            versions = rows.dropna(subset=["source_sha256"]).groupby("source_sha256").run_id.first()
            reasons.append("source changed between runs: " + "; ".join(
                f"run {run} measured source {digest}" for digest, run in versions.items())
                + f" (run `zoo run {variant}` again for one consistent set)")
        standings[variant] = Standing(checked, reasons)
    return standings


def approximates(card: dict) -> str | None:
    """What a variant approximates, from its stored card (older runs stored a Tags.exact flag)."""
    if "approximates" in card:
        return card["approximates"]
    return None if card.get("tags", {}).get("exact", True) else "softmax"


def kind_of(card: dict) -> str:
    """A variant's kind from its stored card (older runs: from its has_parameters tag)."""
    return card.get("kind") or ("layer" if card.get("tags", {}).get("has_parameters") else "core")


def rank_check(kind: str) -> str:
    return f"x-{COMPARATORS[kind]}"


def ratio_header(kind: str, phase: str, n) -> str:
    return f"time / {COMPARATOR_LABELS[COMPARATORS[kind]]}, {phase}, n={n}"


def _fmt_ms(seconds, spread=None) -> str:
    """A time in ms (in s from one second up), and its spread in the same unit."""
    if seconds is None:
        return ""
    scale, unit = (1, "s") if seconds >= 1 else (1e3, "ms")
    text = f"{seconds * scale:.3g} {unit}"
    return text if spread is None else f"{text} ±{spread * scale:.2g}"


def _fmt_x(ratio) -> str:
    return "" if ratio is None else f"{ratio:.3g}x"


def board_rows(store: Store, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the board for ``run_id`` shows: every job of this run and, for each (variant, suite) it did not
    run, the latest job of an earlier comparable run (same settings, same kind of machine), so `zoo run
    windowed` updates windowed's rows and leaves every other variant on the board. Returns (results, jobs);
    each row carries its ``run_id``, each result row its job's ``source_sha256``."""
    settings, environment = store.settings(run_id), store.environment(run_id)
    machine = [environment.get(key) for key in COMPARABLE_ENVIRONMENT]
    runs = store.runs()
    started = dict(zip(runs.run_id, runs.started))
    earlier = [r for r in reversed(list(runs.run_id)) if r != run_id and started[r] <= started[run_id]]
    sources = [run_id] + [r for r in earlier if store.settings(r) == settings
                          and [store.environment(r).get(key) for key in COMPARABLE_ENVIRONMENT] == machine]
    job_parts, result_parts, covered = [], [], set()
    for source in sources:
        jobs = store.jobs(source)
        jobs = jobs.loc[np.array([(v, s) not in covered for v, s in zip(jobs.variant, jobs.suite)], dtype=bool)]
        if jobs.empty:
            continue
        covered |= set(zip(jobs.variant, jobs.suite))
        hashes = {(r.variant, r.suite): r.provenance.get("source_sha256") for r in jobs.itertuples()}
        results = store.results(source)
        results = results.loc[np.array([(v, s) in hashes for v, s in zip(results.variant, results.suite)], dtype=bool)]
        job_parts.append(jobs.assign(run_id=source))
        result_parts.append(results.assign(run_id=source, source_sha256=[hashes[(v, s)] for v, s in
                                                                         zip(results.variant, results.suite)]))
    if not job_parts:
        return store.results(run_id).assign(run_id=run_id, source_sha256=None), store.jobs(run_id)
    return pd.concat(result_parts, ignore_index=True), pd.concat(job_parts, ignore_index=True)


def render(store: Store, run_id: str, out_dir: Path, keep_runs: bool = False) -> list[Path]:
    """Write the board for ``run_id`` into ``out_dir`` as a whole (:func:`board_files`); ``keep_runs`` (``store``
    is the folder's own database): with the export of every run it holds. Returns the paths, README.md first."""
    files = board_files(store, run_id, out_dir)
    stale = [name for name in PLOT_FILES if name not in files]  # a plot an earlier run drew and this one did not
    return BoardFolder(out_dir).publish(files, store=store if keep_runs else None, remove=stale)


def board_files(store: Store, run_id: str, out_dir: Path) -> dict[str, bytes]:
    """The board for ``run_id`` (and the latest comparable results of the variants it did not run:
    :func:`board_rows`) as file name -> content: README.md, index.html, results.csv and the plots. Only
    ``out_dir``'s published long-sequence plot is read from disk."""
    results, jobs = board_rows(store, run_id)
    env = {**store.environment(run_id), **_ran_on(jobs)}
    cards: dict[str, dict] = {}
    for job in jobs.itertuples():  # newest first: a variant's card is the one its latest job recorded
        cards.setdefault(job.variant, job.provenance)
    tidy = results.assign(plugin=results.variant.map(lambda v: cards[v].get("plugin")),
                          origin=results.variant.map(lambda v: _origin(cards[v])))
    csv = tidy[["run_id", *RESULT_COLUMNS, "plugin", "origin", "source_sha256"]].sort_values(
        ["variant", "suite", "check", "mode", "phase", "n"], kind="stable").to_csv(index=False)
    quality, quality_runs = _quality_results(store, results)
    plots = _plots(results)
    plots += [p for p in (_quality_plot(results, quality, store.settings(run_id).get("reference_length")),
                          _recall_plot(quality)) if p]
    readme = _readme(run_id, env, store.settings(run_id), results, cards, [name for name, _ in plots], quality,
                     quality_runs)
    figures = [(png, name.removesuffix(".png")) for name, png in plots]
    long_range = out_dir / LONG_SEQUENCES / "time.png"
    if long_range.exists():  # the long-sequence board's own run, shown with the rest
        figures.append((long_range.read_bytes(), f"time up to long sequences (from {LONG_SEQUENCES}/, a run of its "
                                                 f"own: {LONG_SEQUENCES}/index.html)"))
    page = webpage.page(_page_data(run_id, env, store.settings(run_id), results, cards, quality, quality_runs), figures)
    text = {"README.md": readme, "index.html": page, "results.csv": csv}  # a plugin's lone surrogate becomes "?"
    return {**{name: content.encode("utf-8", "replace") for name, content in text.items()}, **dict(plots)}


def shown_runs(store: Store) -> set[str]:
    """The runs some board shows: for each group of comparable runs (same settings, same kind of machine), what
    the board of its latest run shows (``zoo prune --unshown`` removes the others)."""
    latest = {}
    for run in store.runs().run_id:  # in the order they started: the last of a group wins
        machine = tuple(store.environment(run).get(key) for key in COMPARABLE_ENVIRONMENT)
        latest[(json.dumps(store.settings(run), sort_keys=True), machine)] = run
    shown = set(latest.values())
    for run in latest.values():
        results, _ = board_rows(store, run)
        shown |= set(results.run_id) | set(_quality_results(store, results)[1])
    return shown


def _page_data(run_id, env, settings, results, cards, quality, quality_runs) -> dict:
    """What index.html shows: the ranked tables, why the others are not ranked, and each variant's page."""
    standings = gate(results)
    notes = _Footnotes()
    tables, unranked = _ranked_tables(results, cards, settings, quality, quality_runs, run_id, notes, standings)
    variants = sorted(cards)
    targets = _target_rows(results, cards, variants)
    return {
        "run": run_id, "environment": {k: str(v) for k, v in env.items()}, "intro": _intro(settings),
        "groups": [{"kind": kind, "title": KIND_TITLES[kind], "columns": list(rows[0]) if rows else [], "rows": rows}
                   for kind, rows in tables.items()],
        "notes": notes.reasons, "capabilities": list(TAG_LABELS.values()),
        "unranked": [{"variant": v, "why": "; ".join(standings.get(v, Standing(False)).reasons[:3])
                      or "the correctness suite has not run on it with these settings"} for v in unranked],
        "variants": {v: _variant_page(results, cards[v], v, [t for t in targets if t["variant"] == v]) for v in variants},
    }


def _variant_page(results, provenance, variant, targets) -> dict:
    card = provenance.get("card", {})
    mine = results[results.variant == variant]
    checks = mine[mine.status != MEASURED]
    exponent = {(r.check, r.mode, r.phase): r.value for r in mine.itertuples() if r.check.endswith("-exponent")}
    claims = [{"measure": f"{what} exponent ({mode} {phase})", "claimed": card.get(f"claimed_{key}"),
               "measured": _fmt_exp(exponent.get((f"{check}-exponent", mode, phase)))}
              for what, key, check in (("FLOP", "time", "flops"), ("memory", "memory", "memory"))
              for mode in ("full", "causal") for phase in ("fwd", "fwd+bwd")
              if (f"{check}-exponent", mode, phase) in exponent]
    return {
        "summary": card.get("summary", ""), "citation": card.get("citation", ""), "kind": kind_of(card),
        "family": card.get("family"), "approximates": approximates(card),
        "capabilities": {label: bool(card.get("tags", {}).get(tag)) for tag, label in TAG_LABELS.items()},
        "claims": claims,
        "checks": [{"suite": r.suite, "check": r.check, "setting": r.setting or "", "status": r.status,
                    "detail": "" if pd.isna(r.detail) else r.detail} for r in checks.itertuples()],
        "targets": [{k: t[k] for k in ("target", "where", "goal", "measured", "verdict")} for t in targets],
        "provenance": {"origin": _origin(provenance), "runs": ", ".join(sorted(set(mine.run_id))),
                       **{k: str(v) for k, v in provenance.items() if k != "card" and not isinstance(v, (dict, list))}},
    }


def _quality_results(store: Store, results: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The board's quality rows and the runs they came from; when none of its comparable runs trained
    anything (the quick profile), each variant's latest finished quality job in any run, so the board
    still shows what each variant can learn (labelled with those runs' ids)."""
    quality = results[results.suite == "quality"]
    if quality.empty:
        parts, covered = [], set()
        for run in reversed(list(store.runs().run_id)):
            jobs = store.jobs(run)
            trained = set(jobs[(jobs.suite == "quality") & (jobs.status == "done")].variant) - covered
            if trained:
                rows = store.results(run)
                parts.append(rows[(rows.suite == "quality") & rows.variant.isin(trained)].assign(run_id=run))
                covered |= trained
        quality = pd.concat(parts, ignore_index=True) if parts else quality
    return quality, sorted(set(quality.run_id))


def _ran_on(jobs: pd.DataFrame) -> dict[str, str]:
    """Where the jobs ran, as recorded by each job: the machine(s) and device, with job counts."""
    places = Counter(f"{p['ran_on'].get('host')}, {device_kind(p['ran_on'])}"
                     for p in jobs.provenance if p.get("ran_on"))
    return {"ran on": "; ".join(f"{place} ({count} jobs)" for place, count in sorted(places.items()))} if places else {}


def render_by_device(store: Store, out_dir: Path) -> tuple[Path, int]:
    """One leaderboard per device kind (the latest run of each) in its own folder, and an index that
    compares the kinds side by side: each variant's ranking ratio and correctness on each."""
    latest: dict[str, str] = {}
    for run in store.runs().itertuples():  # ordered by start, so the last one wins
        latest[" + ".join(store.device_kinds(run.run_id))] = run.run_id
    links, columns = [], {}
    for kind, run_id in sorted(latest.items()):
        folder = out_dir / (re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "device")
        render(store, run_id, folder)
        links.append(f"- [{cell(kind)}]({folder.name}/README.md): run {run_id}")
        results, n = store.results(run_id), store.settings(run_id).get("reference_length")
        standings = gate(results)
        kinds = {r.variant: kind_of(r.provenance.get("card", {})) for r in store.jobs(run_id).itertuples()}
        columns[f"{kind} (n={n})"] = {
            variant: " ".join(filter(None, [
                _fmt_x(_value(results, variant, rank_check(kinds.get(variant, "core")), RANK_MODE, RANK_PHASE, n))
                or "not timed", _standing_text(standings[variant]) and f"(unranked: {_standing_text(standings[variant])})"]))
            for variant in sorted(set(results.variant))
        }
    comparison = pd.DataFrame(columns).rename_axis("variant").reset_index() if columns else pd.DataFrame()
    lines = ["# Leaderboards by device", "",
             "Generated by `zoo leaderboard --by device`: the latest run of each device kind.", "", *links, "",
             "## Side by side", "",
             f"Forward+backward time relative to the op each kind is ranked against on the same device (cores: torch "
             f"SDPA; layers: nn.MultiheadAttention; {RANK_MODE} attention, the run's reference length n; lower is "
             "better). Ratios, not times, so devices of different speeds compare.", "",
             _table(comparison.fillna("not run")), ""]
    [index] = BoardFolder(out_dir).publish({"README.md": "\n".join(lines).encode()})
    return index, len(latest)


def _standing_text(standing: Standing) -> str:
    if standing.reasons:
        return "fails correctness" if any(r.startswith("correctness/") for r in standing.reasons) else "error"
    return "" if standing.checked else "correctness not run"


def _accumulated_text(results, run_id) -> str:
    others = sorted(set(results.run_id) - {run_id})
    if not others:
        return "Every figure is from this run."
    kept = sorted(set(results[results.run_id != run_id].variant))
    return (f"This run's results, and for what it did not run the latest results of earlier runs with the same "
            f"settings on the same kind of machine ({', '.join(others)}: {', '.join(kept)}); the *from* column "
            "says which run each ranked row comes from.")


def _runs_text(runs, run_id) -> str:
    """'this run', 'run X', 'runs X, Y' or 'this run and run X': where a variant's rows come from."""
    runs = set(runs)
    others = sorted(runs - {run_id})
    earlier = ("run " if len(others) == 1 else "runs ") + ", ".join(others) if others else ""
    return " and ".join(part for part in ("this run" if run_id in runs else "", earlier) if part)


def _intro(settings) -> str:
    """What the ranking compares and how (README.md and index.html)."""
    reference_n = settings.get("reference_length")
    return (
        "Ranked only when the correctness suite ran on the variant's measured source and every check passed, with "
        "no error in any suite (NaN or inf outputs included). Like is compared with like: attention *cores* against "
        "torch SDPA, attention *layers* (with projections) against nn.MultiheadAttention(need_weights=False), "
        f"each on the same shapes in the same process: non-causal, n = {reference_n}, batch "
        f"{settings.get('speed_batch')}, {settings.get('speed_heads')} heads, d_model {settings.get('speed_d_model')}, "
        f"{settings.get('dtype', 'float32')}, {settings.get('threads')} threads; lower is better. "
        "Variants without a time at that length come last, with the reason. \"exact\": the variant computes its "
        "own documented function exactly (not necessarily softmax). An approximation's error is measured against "
        "the function it approximates, normalised so that 0 is exact and 1 is no better than the trivial answer "
        "(each query's mean of the values it may see), at the same shapes: first the mean over structured inputs "
        "(low-rank and clustered queries and keys), then the worst over all input families (random ones at "
        "higher logit scales included). An approximation no better than the trivial answer on the structured "
        "inputs fails correctness and is not ranked."
    )


def _readme(run_id, env, settings, results, cards, plots, quality, quality_runs) -> str:
    standings = gate(results)
    variants = sorted(cards)
    reference_n = settings.get("reference_length")
    notes = _Footnotes()
    lines = [
        "# Attention zoo leaderboard",
        "",
        "Generated by `zoo run-all` from the run below; do not edit by hand (`zoo leaderboard` re-renders it). "
        + _accumulated_text(results, run_id),
        "",
        _table(pd.DataFrame([{"": k, "value": v} for k, v in {"run": run_id, **env}.items()])),
        "",
        "## Leaderboard",
        "",
        _intro(settings),
        "",
        _noise_line(results, settings),
        "",
    ]
    tables, unranked = _ranked_tables(results, cards, settings, quality, quality_runs, run_id, notes, standings)
    for kind, ranked in tables.items():
        lines += [f"### {KIND_TITLES[kind]}", "", _table(pd.DataFrame(ranked)), ""]
    lines += notes.lines()
    failing = [v for v in unranked if standings.get(v, Standing(False)).reasons]
    if failing:
        lines += ["### Not ranked: failing correctness checks or errors", ""]
        for variant in failing:
            by_check: dict[str, list[str]] = {}
            for reason in standings[variant].reasons:
                check, _, detail = reason.partition(": ")
                by_check.setdefault(check, []).append(detail)
            lines.append(f"- **{cell(variant)}**, {len(by_check)} failing check(s):")
            lines += [f"  - {cell(check)} ({len(details)} case(s)), e.g. {cell(details[0])}" for check, details in by_check.items()]
        lines.append("")
    unchecked = [v for v in unranked if v not in failing]
    if unchecked:
        lines += ["### Unranked: correctness not run", "",
                  "These variants' figures below were measured, but the correctness suite has not run on them with "
                  "these settings, so they are not ranked (`zoo run NAME --suite correctness` with the same `--out`, or "
                  "`--suite correctness` added to the run):", "",
                  *[f"- {cell(v)}" for v in unchecked], ""]
    lines += _correctness_section(results, variants)
    lines += ["## Capabilities", "", _capabilities(cards, variants), ""]
    lines += _complexity_section(results, cards, variants, settings)
    lines += _speed_section(results, cards, variants, reference_n, settings)
    lines += _quality_section(quality, quality_runs, run_id, results, reference_n)
    lines += _targets_section(results, cards, variants)
    if plots:
        lines += ["## Plots", ""] + [f"![{name.removesuffix('.png')}]({name})" for name in plots] + [""]
    return "\n".join(lines)


def _ranked_tables(results, cards, settings, quality, quality_runs, run_id, notes, standings):
    """The ranked rows of each kind ({kind: [row, ...]}, best first, each with its rank) and the variants
    not ranked; shared by README.md and index.html."""
    variants, reference_n = sorted(cards), settings.get("reference_length")
    tables, unranked = {}, []
    for kind in ("core", "layer"):
        members = [v for v in variants if kind_of(cards[v].get("card", {})) == kind]
        if not members:
            continue
        ranked = []
        for variant in members:
            if not standings.get(variant, Standing(False)).ranked:
                unranked.append(variant)
                continue
            row = _ranking_row(results, variant, cards[variant], kind, reference_n, notes,
                               settings.get("noise_threshold"), run_id)
            ranked.append(_with_quality(row, quality, quality_runs, run_id, variant, notes))
        ranked.sort(key=lambda r: r.pop("_key"))
        tables[kind] = [{"rank": i, **r} for i, r in enumerate(ranked, 1)]
    return tables, unranked


class _Footnotes:
    """Numbered reasons for empty cells, shared by the tables above them."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def mark(self, reason: str) -> str:
        if reason not in self.reasons:
            self.reasons.append(reason)
        return f"[{self.reasons.index(reason) + 1}]"

    def lines(self) -> list[str]:
        if not self.reasons:
            return []
        return ["Empty cells:", "", *[f"{i}. {cell(r)}" for i, r in enumerate(self.reasons, 1)], ""]


def _missing(results, variant: str, mode: str, phase: str, n) -> str:
    """Why a variant has no time at (mode, phase, n): the plan's, the safety net's or an error's words."""
    rows = results[(results.variant == variant) & (results.suite == "speed")]
    if rows.empty:
        return "the speed suite did not run on this variant in this run"
    here = rows[(rows.n == n) & (rows["mode"] == mode) & rows.status.isin([SKIPPED, ERROR])]
    if not here.empty:
        return f"n={n}: {here.detail.iloc[0]}"
    if n not in set(rows[rows.check == "time"].n.dropna()):
        errors = rows[rows.status == ERROR]
        if not errors.empty:
            return f"speed suite error: {errors.detail.iloc[0]}"
        return f"n={n} is not among this run's timed lengths"
    return f"no {phase} ratio recorded at n={n}"


def _ranking_row(results, variant, provenance, kind, n, notes, threshold, run_id) -> dict:
    card = provenance.get("card", {})
    check = rank_check(kind)
    row = {"variant": variant, "family": card.get("family")}
    target = approximates(card)
    if target is None:
        row[f"accuracy, n={n}"] = "exact"
    else:  # an approximation's speed is never shown without its cost in accuracy
        error = _value(results, variant, "approximation-error", RANK_MODE, "fwd", n)
        worst = _value(results, variant, "approximation-error-worst", RANK_MODE, "fwd", n)
        row[f"accuracy, n={n}"] = f"approx. of {target}: " + (
            f"error {error:.2f}" + (f", worst {worst:.2f}" if worst is not None else "") if error is not None else
            "not measured " + notes.mark(f"{variant}: " + _approximation_missing(results, variant, n)))
    key = float("inf")
    for phase in (RANK_PHASE, "fwd"):
        ratio = _value(results, variant, check, RANK_MODE, phase, n)
        noisy = _is_noisy(results, variant, RANK_MODE, phase, n, threshold)
        text = _fmt_x(ratio) + (" (noisy)" if noisy else "") if ratio is not None else \
            "not timed " + notes.mark(_missing(results, variant, RANK_MODE, phase, n))
        row[ratio_header(kind, phase, n)] = text
        if phase == RANK_PHASE and ratio is not None:
            key = ratio
    row[f"fwd+bwd time, n={n}"] = _fmt_ms(_value(results, variant, "time", RANK_MODE, RANK_PHASE, n))
    row["complexity claims"] = _claims_verdict(results, variant)
    row["FLOP exp."] = _fmt_exp(_value(results, variant, "flops-exponent", "full", "fwd"))
    row["memory exp."] = _fmt_exp(_value(results, variant, "memory-exponent", "full", "fwd+bwd"))
    row["origin"] = _origin(provenance)
    row["from"] = _runs_text(results[results.variant == variant].run_id, run_id)
    row["_key"] = key
    return row


def _approximation_missing(results, variant, n) -> str:
    skipped = results[(results.variant == variant) & (results.check == "approximation-error")
                      & (results.status == SKIPPED)]
    if not skipped.empty:
        return f"approximation error not measured: {skipped.detail.iloc[0]}"
    return f"approximation error not measured at n={n} in this run (it is taken wherever the speed suite times the variant)"


def _with_quality(row: dict, quality: pd.DataFrame, quality_runs, run_id, variant, notes) -> dict:
    """The ranking row with the variant's mean quality-suite accuracy beside its speed, and the run it is from."""
    if not quality_runs:
        return row
    source = _runs_text(quality_runs, run_id)
    header = "quality: mean accuracy" + ("" if source == "this run" else f" ({source})")
    scores = quality[(quality.variant == variant) & (quality.check == "accuracy")].dropna(subset=["value"])
    row[header] = f"{scores.value.mean():.3f}" if not scores.empty else \
        "not trained " + notes.mark(f"the quality suite did not train {variant} in {source}")
    return row


def _claims_verdict(results, variant) -> str:
    verdicts = results[(results.variant == variant) & results.check.isin(["flops-exponent", "memory-exponent"])]
    if (verdicts.status == FAILED).any():
        return "VIOLATED: " + "; ".join(sorted(set(verdicts[verdicts.status == FAILED].detail)))
    return "hold" if (verdicts.status == PASSED).any() else "not measured"


def _is_noisy(results, variant, mode, phase, n, threshold) -> bool:
    spread = _value(results, variant, "time-spread", mode, phase, n)
    return spread is not None and threshold is not None and spread > threshold


def _noise_line(results, settings) -> str:
    spreads = results[(results.check == "time-spread")].value.dropna()
    threshold = settings.get("noise_threshold")
    if spreads.empty:
        return "Noise: no timed cells on this board."
    over = int((spreads > threshold).sum()) if threshold is not None else 0
    rule = (f"; {over} of {len(spreads)} cells stayed above the {threshold:g} threshold after re-measuring and are "
            "marked (noisy)") if threshold is not None else ""
    return (f"Noise on this board: interquartile range / median of the timed cells (each cell's noisiest callable), "
            f"median {spreads.median():.3g}, largest {spreads.max():.3g}{rule}.")


def _fmt_exp(value) -> str:
    return "" if value is None else f"{value:.2f}"


def _origin(provenance: dict) -> str:
    if provenance.get("distribution"):
        return f"{provenance.get('distribution')} {provenance.get('version')}"
    return f"{provenance.get('kind', '?')}: {Path(str(provenance.get('location', '?'))).name}"


def _correctness_section(results, variants) -> list[str]:
    rows = []
    for variant in variants:
        mine = results[(results.variant == variant) & (results.suite == "correctness")]
        if mine.empty:
            continue
        by_check = mine.groupby("check").status
        rows.append({
            "variant": variant,
            "checks passed": sum(1 for _, s in by_check if (s == PASSED).any() and not s.isin(BAD).any()),
            "failed": sum(1 for _, s in by_check if (s == FAILED).any()),
            "errors": sum(1 for _, s in by_check if (s == ERROR).any()),
            "skipped (capability)": sum(1 for _, s in by_check if (s == SKIPPED).all()),
            "cases run": int(mine.status.isin([PASSED, FAILED]).sum()),
        })
    return ["## Correctness", "", "Each check runs on every case its capability tags allow; "
            "float64 against the reference to 1e-10, float32 to 1e-5 (relative).", "", _table(pd.DataFrame(rows)), ""]


def _capabilities(cards, variants) -> str:
    rows = []
    for variant in variants:
        card = cards[variant].get("card", {})
        tags = card.get("tags", {})
        rows.append({"variant": variant, "approximates": approximates(card) or "- (exact)",
                     **{label: "yes" if tags.get(tag) else "-" for tag, label in TAG_LABELS.items()}})
    return _table(pd.DataFrame(rows))


def _complexity_section(results, cards, variants, settings) -> list[str]:
    rows = []
    for variant in variants:
        card = cards[variant].get("card", {})
        for mode in ("full", "causal"):
            flops = results[(results.variant == variant) & (results.check == "flops-exponent") & (results["mode"] == mode)]
            if flops.empty:
                continue
            mem = results[(results.variant == variant) & (results.check == "memory-exponent") & (results["mode"] == mode)]
            verdicts = pd.concat([flops, mem]).status
            cross = _value(results, variant, "crossover-flops", mode, "fwd")
            rows.append({
                "variant": variant, "mode": mode,
                "claimed time/memory": f"n^{card.get('claimed_time', '?'):g} / n^{card.get('claimed_memory', '?'):g}",
                "FLOPs fwd": _fmt_exp(_value(results, variant, "flops-exponent", mode, "fwd")),
                "FLOPs fwd+bwd": _fmt_exp(_value(results, variant, "flops-exponent", mode, "fwd+bwd")),
                "memory fwd": _fmt_exp(_value(results, variant, "memory-exponent", mode, "fwd")),
                "memory fwd+bwd": _fmt_exp(_value(results, variant, "memory-exponent", mode, "fwd+bwd")),
                "time fwd+bwd": _fmt_exp(_value(results, variant, "time-exponent", mode, "fwd+bwd")),
                "verdict": "violated" if (verdicts == FAILED).any() else ("holds" if (verdicts == PASSED).any() else "n/a"),
                "FLOP crossover with SDPA": "" if cross is None else f"n = {cross:.0f}",
            })
    return ["## Complexity", "",
            "Exponents fitted on log-log over the three largest lengths measured (FLOPs by FlopCounterMode, "
            "fused attention kernels included; peak live tensor memory by a dispatch mode). The verdict "
            "uses FLOPs and memory only (deterministic); the time exponent is from the speed suite. Shapes: batch 1, "
            f"d_model {settings.get('complexity_d_model')}, {settings.get('complexity_heads')} head(s), "
            f"{settings.get('dtype', 'float32')}, on {settings.get('device', 'cpu')}.",
            "", _table(pd.DataFrame(rows)), "", *_allocator_section(results, variants)]


def _allocator_section(results, variants) -> list[str]:
    """On a GPU: the CUDA caching allocator's peak at the largest length, beside the counted peak."""
    peaks = results[results.check == "cuda-allocator-peak"].dropna(subset=["n"])
    if peaks.empty:
        return []
    rows = []
    for (variant, mode, phase), group in peaks.groupby(["variant", "mode", "phase"], sort=False):
        n = int(group.n.max())
        rows.append({"variant": variant, "mode": mode, "pass": phase, "n": n,
                     "CUDA allocator peak (MiB)": (_value(results, variant, "cuda-allocator-peak", mode, phase, n) or 0) / 2 ** 20,
                     "counted peak (MiB)": (_value(results, variant, "memory", mode, phase, n) or 0) / 2 ** 20})
    rows.sort(key=lambda r: (variants.index(r["variant"]) if r["variant"] in variants else len(variants), r["mode"]))
    return ["### GPU memory", "",
            "The CUDA caching allocator's peak during one call above what was allocated before it, at the "
            "largest length measured; the counted peak is the dispatch mode's figure the exponents use.", "",
            _table(pd.DataFrame(rows)), ""]


def _kernels(results, variant, mode, phase, n) -> str:
    """The fused attention kernels a timed call ran (its sdpa-backend row), without aten's decorations."""
    rows = results[(results.variant == variant) & (results.check == "sdpa-backend") & (results["mode"] == mode)
                   & (results.phase == phase) & (results.n == n)].detail.dropna()
    if rows.empty:
        return ""
    names = [re.sub(r"^aten\._scaled_dot_product_|\.default$", "", op.strip()) for op in rows.iloc[-1].split(",")]
    forward = [name for name in names if not name.endswith("_backward")]
    return ", ".join(name + (" (+ backward)" if f"{name}_backward" in names else "") for name in forward)


def _speed_section(results, cards, variants, ref, settings) -> list[str]:
    speed = results[(results.suite == "speed") & (results.check == "time")]
    lengths = sorted(int(n) for n in speed.n.dropna().unique())
    threshold = settings.get("noise_threshold")
    notes = _Footnotes()
    rows = []
    for variant in variants:
        versus = COMPARATORS[kind_of(cards[variant].get("card", {}))]
        for mode in ("full", "causal"):
            for phase in ("fwd", "fwd+bwd"):
                if speed[(speed.variant == variant) & (speed["mode"] == mode) & (speed.phase == phase)].empty:
                    continue
                row = {"variant": variant, "mode": mode, "pass": phase, "versus": versus}
                for n in lengths:
                    t = _value(results, variant, "time", mode, phase, n)
                    if t is None:
                        row[f"n={n}"] = "not timed " + notes.mark(_missing(results, variant, mode, phase, n))
                        continue
                    iqr, x = (_value(results, variant, check, mode, phase, n) for check in ("time-iqr", f"x-{versus}"))
                    error = _value(results, variant, "approximation-error", mode, "fwd", n) if phase == "fwd" else None
                    row[f"n={n}"] = (_fmt_ms(t, iqr)
                                     + (f" ({_fmt_x(x)})" if x is not None else " (no ratio)")
                                     + (" noisy" if _is_noisy(results, variant, mode, phase, n, threshold) else "")
                                     + (f"; approx. error {error:.2f}" if error is not None else ""))
                rows.append(row)
    extra = []
    for variant in variants:
        mine = results[(results.variant == variant) & results.check.str.startswith("x-")]
        versus = f"x-{COMPARATORS[kind_of(cards[variant].get('card', {}))]}"
        peers = set(cards[variant].get("card", {}).get("peers", []))
        for check in sorted(({c for c in mine.check.unique()} | {f"x-{p}" for p in peers}) - {versus}):
            who = check[2:]
            for mode in ("full", "causal"):
                for phase in ("fwd", "fwd+bwd"):
                    values = {n: _value(results, variant, check, mode, phase, n) for n in lengths}
                    timed_here = _value(results, variant, "time", mode, phase, None) is not None
                    if any(v is not None for v in values.values()) or (who in peers and phase == "fwd" and timed_here):
                        extra.append({"variant": variant, "versus": who + (" (peer)" if who in peers else ""),
                                      "mode": mode, "pass": phase,
                                      **{f"n={n}": (_fmt_x(v) + _first_call(results, variant, who, mode, n) if v is not None
                                                    else _baseline_gap(results, variant, who, mode, n, notes))
                                         for n, v in values.items()}})
    sweeps = []
    for row in results[results.check == "approximation-error-sweep"].itertuples():
        option = row.setting.rsplit(" ", 1)[-1]
        worst = results[(results.variant == row.variant) & (results.check == "approximation-error-sweep-worst")
                        & (results.setting == row.setting)]
        sweeps.append({"variant": row.variant, "option": option, f"error at n={int(row.n)}": f"{row.value:.3g}",
                       "worst input family": "" if worst.empty else f"{worst.value.iloc[0]:.3g}"})
    sweep_lines = [] if not sweeps else [
        "### Approximation error against the plugin's own options", "",
        "Each approximation's normalised error (0 exact, 1 = each query's mean of the values) at the values of "
        "the options its plugin sweeps, on the speed suite's shapes, non-causal: first the mean over the "
        "structured inputs, then the worst input family.", "", _table(pd.DataFrame(sweeps)), ""]
    rates = []
    for variant in variants:
        for mode in ("full", "causal"):
            for phase in ("fwd", "fwd+bwd"):
                g = _value(results, variant, "gflops", mode, phase, ref)
                if g is not None:
                    fraction = _value(results, variant, "peak-fraction", mode, phase, ref)
                    rates.append({"variant": variant, "mode": mode, "pass": phase, f"GFLOP/s at n={ref}": _fmt_g(g),
                                  "% of matmul peak": _fmt_g(None if fraction is None else 100 * fraction),
                                  "tokens/s": _fmt_g(_value(results, variant, "tokens-per-s", mode, phase, ref)),
                                  "fused attention kernels": _kernels(results, variant, mode, phase, ref)})
    peak = results[results.check == "matmul-peak"].value.dropna()
    peak_text = f"{peak.median():.3g} GFLOP/s (median over the run's workers)" if not peak.empty else "not measured"
    dtype = settings.get("dtype", "float32")
    return ["## Speed", "",
            "Median time per call over interleaved rounds (± interquartile range) and, in brackets, the ratio "
            "to the op named under *versus* (torch SDPA for cores, nn.MultiheadAttention(need_weights=False) for "
            "layers) on the same shapes in the same process (median of per-round ratios); *noisy* marks a cell "
            "whose IQR/median stayed above the run's threshold after re-measuring. An approximation's forward "
            "cells also give its normalised error at that length (0 exact, 1 = each query's mean of the values). "
            f"{dtype.capitalize()} matmul peak of this machine in this run: {peak_text}.", "",
            _table(pd.DataFrame(rows)), "", *notes.lines(), "### Against each variant's own baselines, floors and torch SDPA", "",
            "Time of the variant / time of the named callable, same shapes, same process (a *floor* is the op "
            "the variant cannot avoid, timed in the forward pass only; a *peer* is another library's "
            "implementation of the same function, timed in the forward pass after a first call that is not "
            "timed, whose output agreed with the variant's; its first call, where compilation happens, is "
            "given beside its ratio).", "",
            _table(pd.DataFrame(extra)), "", *sweep_lines, "### Achieved rate", "", _table(pd.DataFrame(rates)), ""]


def _first_call(results, variant, who, mode, n) -> str:
    """A peer's first call at n (compilation happens there), shown beside its ratio."""
    seconds = _value(results, variant, f"{who}-first-call", mode, "fwd", n)
    return "" if seconds is None else f"; first call {seconds:.2g} s"


def _baseline_gap(results, variant, who, mode, n, notes) -> str:
    """Why a baseline has no ratio at n: the plan's reason if it left the baseline out."""
    rows = results[(results.variant == variant) & (results.check == f"{who}-plan") & (results.n == n)
                   & (results["mode"] == mode)]
    return "not timed " + notes.mark(f"{who}, n={n}: {rows.detail.iloc[0]}") if not rows.empty else ""


def _fmt_g(value, spec: str = ".3g") -> str:
    return "" if value is None else format(value, spec)


def _targets_section(results, cards, variants) -> list[str]:
    return ["## Targets the plugins set themselves", "",
            "Declared by each plugin (`zoo.Target`) and judged here against this run's rows. "
            "Lengths beyond the profile's are not measured: run `--profile full` for those.", "",
            _table(pd.DataFrame(_target_rows(results, cards, variants))), ""]


def _target_rows(results, cards, variants) -> list[dict]:
    rows = []
    for variant in variants:
        for recorded in cards[variant].get("card", {}).get("targets", []):
            target = Target(**{f.name: recorded[f.name] for f in fields(Target) if f.name in recorded})
            sel = results[(results.variant == variant) & (results.check == target.check)
                          & (results["mode"] == target.mode) & (results.phase == target.phase)].dropna(subset=["value"])
            if target.n is not None:
                sel = sel[sel.n == target.n]
            if sel.empty:
                verdict, measured = "not measured in this run", ""
            else:
                verdict = "met" if all(target.met_by(v) for v in sel.value) else "not met"
                measured = ", ".join(f"n={int(r.n)}: {r.value:.3g}" for r in sel.itertuples())
            where = f"n={target.n}" if target.n is not None else "every timed n"
            rows.append({"variant": variant, "target": target.note, "measure": target.check,
                         "where": f"{target.mode} {target.phase}, {where}", "goal": target.bound(),
                         "measured": measured, "verdict": verdict})
    return rows


def _quality_section(quality, quality_runs, run_id, results, reference_n) -> list[str]:
    scores = quality[quality.check == "accuracy"]
    if scores.empty:
        return ["## Quality", "", "_Not in this run: `zoo run-all --suite quality` (or `--profile full`) trains "
                "every variant on the synthetic tasks._", ""]
    tasks = list(dict.fromkeys(scores.setting))
    rows = []
    for variant in sorted(set(scores.variant)):
        mine = scores[scores.variant == variant]
        row = {"variant": variant}
        for task in tasks:
            hit = mine[mine.setting == task]
            if hit.empty:
                row[task] = ""
            elif hit.status.iloc[0] == SKIPPED or pd.isna(hit.value.iloc[0]):
                row[task] = f"skipped: {hit.detail.iloc[0]}"
            else:
                spread = _setting_value(quality, variant, "accuracy-std", task)
                row[task] = f"{hit.value.iloc[0]:.3f}" + ("" if spread is None else f" ± {spread:.3f}")
        rows.append(row)
    chance = {task: _setting_value(quality, None, "chance", task) for task in tasks}
    rows.append({"variant": "(chance)", **{t: "" if c is None else f"{c:.3f}" for t, c in chance.items()}})
    hp = pd.Series(quality[quality.check == "hyper-parameters"].detail.unique())
    source = _runs_text(quality_runs, run_id) + ("" if run_id in quality_runs else
                                                 " (this run did not train them; the latest run that did)")
    timed = {v for v in set(scores.variant) if _value(results, v, f"x-{SDPA}", RANK_MODE, RANK_PHASE, reference_n) is not None}
    absent = sorted(set(scores.variant) - timed) if timed else []
    plot_note = (f" The accuracy-versus-speed plot leaves out {', '.join(absent)}: not timed at n = {reference_n}."
                 if absent else "")
    lines = ["## Quality", "",
             f"From {source}. Accuracy on fresh examples after training with the same budget and hyper-parameters "
             f"({'; '.join(hp) if not hp.empty else 'see results.csv'}); mean ± std over seeds.{plot_note}", "",
             _table(pd.DataFrame(rows)), ""]
    curve = quality[quality.check == "recall-vs-pairs"].dropna(subset=["value", "n"])
    if not curve.empty:
        pairs = sorted(int(p) for p in set(curve.n))
        table = [{"variant": variant, **{f"{p} pairs": _fmt_g(_setting_value(curve, variant, "recall-vs-pairs",
                                                                               f"pairs={p}"), ".3f") for p in pairs}}
                 for variant in sorted(set(curve.variant))]
        example = curve.sort_values("n").detail.iloc[-1]
        lines += ["### Associative recall versus number of pairs", "",
                  "Multi-query associative recall (Zoology, Arora et al. 2023) at growing difficulty for a model of "
                  "fixed width: more key-value pairs to hold, from a key vocabulary twice their number. Softmax "
                  "attention can look each key up exactly; a fixed-size state (linear attention) must compress all "
                  f"pairs and is expected to fall behind as they grow. Settings at the largest: {example}.", "",
                  _table(pd.DataFrame(table)), ""]
    return lines


def _setting_value(results, variant, check, setting):
    """The value of ``check`` at ``setting`` (for one variant, or any), or None."""
    rows = results[(results.check == check) & (results.setting == setting)].dropna(subset=["value"])
    if variant is not None:
        rows = rows[rows.variant == variant]
    return None if rows.empty else float(rows.value.iloc[-1])


def _quality_plot(results: pd.DataFrame, quality: pd.DataFrame, reference_n) -> tuple[str, bytes] | None:
    """Mean accuracy over tasks against speed, one point per variant, the Pareto front joined: the variants
    no other beats on both at once."""
    scores = quality[quality.check == "accuracy"].dropna(subset=["value"])
    if scores.empty:
        return None
    plt = _pyplot()
    accuracy = scores.groupby("variant").value.mean()
    speed = results[(results.check == f"x-{SDPA}") & (results["mode"] == RANK_MODE) & (results.phase == RANK_PHASE)
                    & (results.n == reference_n)].groupby("variant").value.last()
    if speed.reindex(accuracy.index).notna().any():
        x, label = speed.reindex(accuracy.index), f"forward+backward time / torch SDPA at n={reference_n} (lower is faster)"
    else:
        x = quality[quality.check == "train-seconds"].groupby("variant").value.sum()
        x, label = x.reindex(accuracy.index), "training seconds over all tasks (lower is faster)"
    points = pd.DataFrame({"x": x, "accuracy": accuracy}).dropna().sort_values(["x", "accuracy"], ascending=[True, False])
    front = points[points.accuracy > points.accuracy.cummax().shift(fill_value=-1.0)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.step(front.x, front.accuracy, where="post", color="0.6", linestyle="--", label="Pareto front", zorder=1)
    for variant, point in points.iterrows():
        on_front = variant in front.index
        ax.scatter(point.x, point.accuracy, marker="o" if on_front else "x", s=40, zorder=2)
    ax.set_xscale("log")
    _label_points(ax, [(point.x, point.accuracy, variant) for variant, point in points.iterrows()])
    ax.set_xlabel(label)
    ax.set_ylabel("mean accuracy over the quality tasks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, "accuracy-vs-speed.png")


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _recall_plot(quality: pd.DataFrame) -> tuple[str, bytes] | None:
    curve = quality[quality.check == "recall-vs-pairs"].dropna(subset=["value", "n"])
    if curve.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (variant, series) in enumerate(curve.groupby("variant")):
        series = series.sort_values("n")
        ax.plot(series.n.astype(float), series.value, marker=MARKERS[i % len(MARKERS)],
                linestyle=LINE_STYLES[i % len(LINE_STYLES)], label=variant)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(curve.n.astype(float))), [str(int(p)) for p in sorted(set(curve.n))])
    ax.set_xlabel("key-value pairs to recall (key vocabulary grows with them; model width fixed)")
    ax.set_ylabel("recall accuracy on fresh examples")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, "recall-vs-pairs.png")


def _save(plt, fig, name: str) -> tuple[str, bytes]:
    """The figure as (file name, PNG bytes)."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return name, buffer.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plots(results: pd.DataFrame) -> list[tuple[str, bytes]]:
    plt = _pyplot()
    figures = [
        ("time", "speed", "time", "full", "fwd+bwd", "seconds per call (forward+backward, speed shapes)", f"{SDPA}-time"),
        ("flops", "complexity", "flops", "full", "fwd", "FLOPs (forward, complexity shapes)", f"{SDPA}-flops"),
        ("memory", "complexity", "memory", "full", "fwd+bwd", "peak live tensor bytes (forward+backward)", f"{SDPA}-memory"),
    ]
    written = []
    for name, suite, check, mode, phase, label, reference in figures:
        rows = results[(results.suite == suite) & (results["mode"] == mode) & (results.phase == phase)].dropna(subset=["value", "n"])
        ours = rows[rows.check == check]
        if ours.empty:
            continue
        fig, ax = plt.subplots(figsize=(9, 5.5))
        ends = []
        for index, (variant, series) in enumerate(ours.groupby("variant")):
            series = series.sort_values("n")
            color, marker, dashes = _line_style(index)
            ax.plot(series.n.astype(float), series.value, color=color, marker=marker, linestyle=dashes, label=variant)
            ends.append((float(series.n.iloc[-1]), float(series.value.iloc[-1]), variant, color))
        ref = rows[rows.check == reference].groupby("n").value.median()
        if not ref.empty:
            ax.plot(ref.index.astype(float), ref.values, color="black", linestyle="--", linewidth=2, label="torch SDPA")
            ends.append((float(ref.index[-1]), float(ref.values[-1]), "torch SDPA", "black"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        _label_line_ends(ax, ends)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.22, 1.0), frameon=False)
        written.append(_save(plt, fig, f"{name}.png"))
    return written


def _line_style(index: int):
    """A colour, marker and line style per series, so no two of up to 20 x 8 lines look alike."""
    import matplotlib

    colors = matplotlib.colormaps["tab20"].colors
    return (colors[index % len(colors)], MARKERS[index % len(MARKERS)],
            LINE_STYLES[(index // len(MARKERS)) % len(LINE_STYLES)])


def _label_points(ax, points, fontsize: int = 8):
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


def _label_line_ends(ax, ends, min_gap_decades: float = 0.07):
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
