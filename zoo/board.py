"""The board of one run, as every section reads it: the rows it shows, each variant's card, the run's settings
and the suites that drew them; and the helpers sections share (escaping, formatting, footnotes).

What a board shows for run R: every job of R and, for each (variant, suite) R did not run, the latest job of that
suite in an earlier comparable run (the same settings of that suite and of the run as a whole, the same kind of
machine), so ``zoo run windowed`` updates windowed's rows and leaves every other variant on the board, and a run
that changed one suite's settings keeps the other suites' earlier rows. A suite that is ``carried`` shows, for each
variant with no rows of it among those on its current source, the variant's latest rows of it on that source from any
run instead (another machine's, other settings'), labelled with their runs; those rows are shown, never gated.

A figure that states an interval (``low``/``high``: a timing's, over its run's processes and rounds) also spans
the same figure in up to :data:`RERUNS` earlier jobs of that suite, variant and source on the same settings and
kind of machine, timed in the same form (:data:`zoo.checks.TIMING_FORM`): what a rerun saw, which one run's
processes, minutes apart, understate (on the 2-core machine the committed boards come from, mamba2's ranked ratio
was 0.419x [0.4-0.429] in one quick run, 0.509x in the next).

A variant's current source is the one its newest job on the board measured. A job that measured another source is
*stale*: its rows leave the board (they neither rank nor block the variant), and the board names the suites and
runs so dropped with the ``zoo run`` command that measures them again on the current source.
"""

from __future__ import annotations

import functools
import html
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import tabulate

from .checks import PASSED, WORKER_CHECK, form_changes
from .contract import BEST_KNOWN_SLACK, Tags
from .environment import machine_kind, machine_text, timing_form
from .store import Store
from .suite import RankFigure, Suite, implicit_suite, upgrade_rows

CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
KIND_TITLES = {"core": "Attention cores (no parameters)", "layer": "Attention layers (with projections)"}


def cell(value) -> str:
    """Plugin text made safe for a Markdown table cell and any HTML renderer."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    text = CONTROL_CHARACTERS.sub("\ufffd", " ".join(str(value).split()))  # NUL, ESC: no terminal tricks
    return (html.escape(text, quote=False).replace("|", "&#124;").replace("`", "'")  # no code span: quotes read
            .replace("](", "&#93;("))  # no link or image of a plugin's making (footnote marks [1] stay)


def markdown_table(rows: list[dict] | pd.DataFrame) -> str:
    """Rows as a GitHub Markdown table, every text (headers too) escaped; ``_(none)_`` without rows."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if frame.empty:
        return "_(none)_"
    safe = frame.map(lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else cell(v))
    safe.columns = [cell(column) for column in safe.columns]  # headers can be plugin text too (task names)
    return tabulate(safe, headers="keys", tablefmt="github", showindex=False, floatfmt=".3g")


def fmt_ms(seconds, spread=None) -> str:
    """A time in ms (in s from one second up), and its spread in the same unit."""
    if seconds is None:
        return ""
    scale, unit = (1, "s") if seconds >= 1 else (1e3, "ms")
    text = f"{seconds * scale:.3g} {unit}"
    return text if spread is None else f"{text} ±{spread * scale:.2g}"


def fmt_x(ratio) -> str:
    """A ratio as '0.194x' ('' for none)."""
    return "" if ratio is None else f"{ratio:.3g}x"


def fmt_g(value, spec: str = ".3g") -> str:
    """A number in ``spec`` ('' for none)."""
    return "" if value is None else format(value, spec)


def fmt_exp(value) -> str:
    """A fitted exponent with two decimals ('' for none)."""
    return "" if value is None else f"{value:.2f}"


class Footnotes:
    """Numbered reasons for empty cells, shared by the tables above them."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def mark(self, reason: str) -> str:
        """The mark of ``reason`` ('[k]'), numbered on first use."""
        if reason not in self.reasons:
            self.reasons.append(reason)
        return f"[{self.reasons.index(reason) + 1}]"

    def lines(self) -> list[str]:
        """The numbered reasons as README lines (none without marks)."""
        if not self.reasons:
            return []
        return ["Empty cells:", "", *[f"{i}. {cell(r)}" for i, r in enumerate(self.reasons, 1)], ""]


def approximates(card: dict) -> str | None:
    """What a variant approximates, from its stored card (older runs stored a Tags.exact flag)."""
    if "approximates" in card:
        return card["approximates"]
    return None if card.get("tags", {}).get("exact", True) else "softmax"


def kind_of(card: dict) -> str:
    """A variant's kind from its stored card (older runs: from its has_parameters tag)."""
    return card.get("kind") or ("layer" if card.get("tags", {}).get("has_parameters") else "core")


def best_known(card: dict) -> str:
    """The label of the fastest known implementation of the variant's math, as its card recorded it ('' for
    none declared, or a run stored before plugins declared one)."""
    return str(card.get("best_known") or "")


def behind_mark(ratio: float, low: float | None, confirmed: bool = True) -> str:
    """'' for a ratio to the best known implementation within :data:`zoo.contract.BEST_KNOWN_SLACK`, else 'behind',
    or 'behind?' where its interval reaches down to the slack or no second process or run ``confirmed`` it."""
    if ratio <= BEST_KNOWN_SLACK:
        return ""
    return "behind" if (low is None or low > BEST_KNOWN_SLACK) and confirmed else "behind?"


def best_known_rows(board, check: str, phases, lengths, confirmed=None, earlier=None
                    ) -> tuple[list[dict], list[str]]:
    """Per variant with a declared best known implementation, per mode and pass measured: its ``check`` ratio
    (``time-ratio``, ``memory-ratio``) to that implementation at each length, each ratio over
    :data:`zoo.contract.BEST_KNOWN_SLACK` marked *behind* (*behind?* where its stated interval reaches down to
    the slack, or where ``confirmed(variant, mode, phase, n, label)`` says no second process or run measured it:
    a rerun may find it within), and *earlier form* where ``earlier(variant, mode, label)`` says it was timed
    before a change to that call; and the variants that declare none."""
    rows, undeclared = [], []
    for variant in board.variants:
        label = best_known(board.card(variant))
        if not label:
            undeclared.append(variant)
            continue
        for mode in ("full", "causal"):
            for phase in phases:
                ratios = {n: board.value(variant, check, mode, phase, n, versus=label) for n in lengths}
                if all(x is None for x in ratios.values()):
                    continue
                lows = {n: board.value(variant, check, mode, phase, n, versus=label, field="low") for n in lengths}
                marks = {n: behind_mark(x, lows[n], confirmed is None or confirmed(variant, mode, phase, n, label))
                         for n, x in ratios.items() if x is not None}
                behind = [n for n, mark in marks.items() if mark]
                unsure = {n for n in behind if marks[n] == "behind?"}
                former = " earlier form" if earlier is not None and earlier(variant, mode, label) else ""
                rows.append({"variant": variant, "best known": label, "mode": mode, "pass": phase,
                             **{f"n={n}": "" if x is None else fmt_x(x) + (f" {marks[n]}" if marks[n] else "")
                                + former for n, x in ratios.items()},
                             "verdict": (f"behind at n={', '.join(f'{n}?' if n in unsure else str(n) for n in behind)}"
                                         if behind else f"within {BEST_KNOWN_SLACK:g}x")})
    return rows, undeclared


def origin_text(provenance: dict) -> str:
    """Where a variant came from, short: its distribution and version, else its kind and file."""
    if provenance.get("distribution"):
        return f"{provenance.get('distribution')} {provenance.get('version')}"
    return f"{provenance.get('kind', '?')}: {Path(str(provenance.get('location', '?'))).name}"


def runs_text(runs, run_id: str) -> str:
    """'this run', 'run X', 'runs X, Y' or 'this run and run X': where rows come from."""
    runs = set(runs)
    others = sorted(runs - {run_id})
    earlier = ("run " if len(others) == 1 else "runs ") + ", ".join(others) if others else ""
    return " and ".join(part for part in ("this run" if run_id in runs else "", earlier) if part)


def board_group(store: Store, run: str) -> tuple:
    """What makes runs one board's: their settings and the kind of machine. Settings are compared as read back
    (:meth:`zoo.Profile.from_dict`), not as stored: a run stored before settings were nested under their suites
    shares a board with a new run that measures the same way."""
    return (json.dumps(_comparable_settings(store.settings(run)), sort_keys=True),
            *machine_kind(store.environment(run)))


def suite_group(store: Store, run: str, suite: str) -> tuple:
    """What makes two runs' rows of ``suite`` comparable: the run-wide settings (device, dtype, threads,
    processes, variant options...), that suite's own settings and the kind of machine; another suite's settings
    do not enter (a settings group of runs stored in a form this zoo cannot read: all of them, as stored)."""
    settings = _comparable_settings(store.settings(run))
    if isinstance(settings.get("suites"), dict):
        settings = {**{k: v for k, v in settings.items() if k != "suites"}, "suite": settings["suites"].get(suite)}
    return (json.dumps(settings, sort_keys=True, default=str),
            *machine_kind(store.environment(run)))


def _comparable_settings(settings: dict) -> dict:
    from .api import default_registry
    from .profiles import Profile, settled

    try:
        data, suites = Profile.from_dict(settings).as_dict(), default_registry().suites
        data["suites"] = {name: settled(suites[name], values) if name in suites else values
                          for name, values in data["suites"].items()}
        return data
    except (TypeError, ValueError, KeyError, AttributeError):  # not a profile this zoo reads: compared as stored
        return settings


RERUNS = 2
"""How many earlier jobs of the same source a figure's interval also spans (with the board's own: three runs)."""
IDENTITY = ["variant", "suite", "check", "mode", "phase", "n", "versus", "batch", "params"]
"""The typed fields that say which figure a row is: the same in two runs, the same figure."""


def board_rows(store: Store, run_id: str, exclude: frozenset[str] = frozenset()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows and jobs the board for ``run_id`` accumulates (see the module), never from the runs in
    ``exclude`` (held back as too noisy); each row carries its ``run_id``, each result row its job's
    ``source_sha256`` and its run's ``timing_form``, and a figure with an interval the earlier runs of its source
    and timing form it spans (``reruns``, their count) and the spread of all those runs' figures (``between_runs``:
    (largest - smallest) / its value)."""
    runs = store.runs()
    started = dict(zip(runs.run_id, runs.started))
    earlier = [r for r in reversed(list(runs.run_id))
               if r != run_id and r not in exclude and started[r] <= started[run_id]]
    groups = functools.cache(lambda run, suite: suite_group(store, run, suite))
    job_parts, result_parts, rerun_parts = [], [], []
    chosen: dict[tuple, str | None] = {}  # (variant, suite) -> the source hash of the job the board shows
    forms: dict[tuple, str] = {}  # (variant, suite) -> the timing form of the run of the job the board shows
    reruns: dict[tuple, int] = {}
    for source in [run_id] + earlier:
        jobs = store.jobs(source)
        jobs = jobs.loc[np.array([source == run_id or groups(source, s) == groups(run_id, s)
                                  for s in jobs.suite], dtype=bool)]
        hashes = {(r.variant, r.suite): r.provenance.get("source_sha256") for r in jobs.itertuples()}
        shown = {key: h for key, h in hashes.items() if key not in chosen}
        form = timing_form(store.environment(source))  # a figure timed in another form is another figure
        again = {key for key, h in hashes.items() if key in chosen and isinstance(h, str) and h == chosen[key]
                 and reruns.get(key, 0) < RERUNS and forms[key] == form}
        again &= {(r.variant, r.suite) for r in jobs.itertuples() if r.status == "done"}
        if not shown and not again:
            continue
        results = store.results(source)
        keys = list(zip(results.variant, results.suite))
        if again:
            rerun_parts.append(results.loc[np.array([key in again for key in keys], dtype=bool)])
            for key in again:
                reruns[key] = reruns.get(key, 0) + 1
        if shown:
            chosen.update(shown)
            forms.update(dict.fromkeys(shown, form))
            job_parts.append(jobs.loc[np.array([(v, s) in shown for v, s in zip(jobs.variant, jobs.suite)],
                                               dtype=bool)].assign(run_id=source))
            results = results.loc[np.array([key in shown for key in keys], dtype=bool)]
            result_parts.append(results.assign(run_id=source, timing_form=form, source_sha256=[
                shown[key] for key in zip(results.variant, results.suite)]))
    if not job_parts:
        alone = store.results(run_id).assign(run_id=run_id, source_sha256=None,
                                             timing_form=timing_form(store.environment(run_id)))
        return _spanning_reruns(alone, []), store.jobs(run_id)
    return _spanning_reruns(pd.concat(result_parts, ignore_index=True), rerun_parts), pd.concat(
        job_parts, ignore_index=True)


def _identity(rows: pd.DataFrame) -> list[tuple]:
    """Each row's :data:`IDENTITY`, hashable (params as sorted JSON, a missing value as None)."""
    def plain(value):
        if isinstance(value, dict):
            return json.dumps(value, sort_keys=True, default=str)
        return None if value is None or (isinstance(value, float) and np.isnan(value)) else value

    columns = [rows[c] if c in rows else pd.Series([None] * len(rows), index=rows.index) for c in IDENTITY]
    return [tuple(plain(v) for v in values) for values in zip(*columns)]


def _spanning_reruns(results: pd.DataFrame, rerun_parts: list[pd.DataFrame]) -> pd.DataFrame:
    """``results`` with every figure that states an interval widened to the same figure's values in the earlier
    runs of its source and timing form (``rerun_parts``), and its ``reruns`` and ``between_runs`` columns."""
    results = results.assign(reruns=0, between_runs=np.nan)
    if not rerun_parts:
        return results
    earlier: dict[tuple, list[float]] = {}
    for part in rerun_parts:
        for key, value in zip(_identity(part), part.value):
            if isinstance(value, (int, float)) and np.isfinite(value):
                earlier.setdefault(key, []).append(float(value))
    keys = _identity(results)
    counts = pd.Series(keys).value_counts()
    low, high, reruns, between = (results[c].to_numpy(dtype=float, copy=True) for c in ("low", "high", "reruns",
                                                                                         "between_runs"))
    values = pd.to_numeric(results.value, errors="coerce").to_numpy(dtype=float)
    for i, key in enumerate(keys):
        seen = earlier.get(key)
        if not seen or counts[key] > 1 or np.isnan(low[i]) or np.isnan(high[i]) or not values[i] > 0:
            continue  # no earlier figure, an ambiguous one, or no interval to widen
        low[i], high[i] = min(low[i], *seen), max(high[i], *seen)
        reruns[i] = len(seen)
        between[i] = (max(values[i], *seen) - min(values[i], *seen)) / values[i]
    return results.assign(low=low, high=high, reruns=reruns.astype(int), between_runs=between)


def _carried_rows(store: Store, suite: str, current: dict, wanted: set[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of ``suite`` of each ``wanted`` variant from its latest finished job of it in any run on its
    ``current`` source; and the latest stale job of each wanted variant that has none, whose rows are dropped (what
    the board names to measure again)."""
    parts, stale_parts, covered, seen_stale = [], [], set(), set()
    for run in reversed(list(store.runs().run_id)):
        jobs = store.jobs(run)
        jobs = jobs[(jobs.suite == suite) & (jobs.status == "done") & jobs.variant.isin(wanted - covered)]
        if jobs.empty:
            continue
        stale = _is_stale(jobs.variant, _job_hashes(jobs), current)
        stale_parts.append(jobs.loc[stale & ~jobs.variant.isin(seen_stale)].assign(run_id=run))
        seen_stale |= set(jobs.variant[stale])
        jobs = jobs.loc[~stale]
        if not jobs.empty:
            hashes = {r.variant: r.provenance.get("source_sha256") for r in jobs.itertuples()}
            rows = store.results(run)
            rows = rows[(rows.suite == suite) & rows.variant.isin(hashes)]
            parts.append(rows.assign(run_id=run, source_sha256=rows.variant.map(hashes)))
            covered |= set(hashes)
    stale_jobs = [part[~part.variant.isin(covered)] for part in stale_parts]
    return (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(),
            pd.concat(stale_jobs, ignore_index=True) if stale_jobs else pd.DataFrame())


def current_sources(jobs: pd.DataFrame) -> dict[str, str | None]:
    """Each variant's current source: the hash its newest job recorded (``jobs`` newest first)."""
    current: dict[str, str | None] = {}
    for job in jobs.itertuples():
        current.setdefault(job.variant, job.provenance.get("source_sha256"))
    return current


def _is_stale(variants, hashes, current: dict) -> np.ndarray:
    """Which rows measured a source other than their variant's current one (an unrecorded hash never is)."""
    return np.array([isinstance(h, str) and isinstance(current.get(v), str) and h != current[v]
                     for v, h in zip(variants, hashes)], dtype=bool)


def _job_hashes(jobs: pd.DataFrame) -> list:
    return [p.get("source_sha256") for p in jobs.provenance]


def _environments(store: Store, rows: pd.DataFrame) -> dict[str, dict]:
    return {run: store.environment(run) for run in set(rows.run_id)} if "run_id" in rows else {}


@dataclass
class Board:
    """One run's board (see the module): ``results`` are the rows the ranking is gated on, ``carried`` the rows
    of carried suites from elsewhere; ``notes`` number the empty cells of the ranked tables."""

    run_id: str
    settings: dict
    environment: dict
    results: pd.DataFrame
    jobs: pd.DataFrame
    cards: dict[str, dict]
    suites: dict[str, Suite]
    carried: dict[str, pd.DataFrame] = field(default_factory=dict)
    stale_jobs: pd.DataFrame = field(default_factory=pd.DataFrame)  # jobs of an older source, their rows dropped
    folder: str | None = None  # the board's folder as a reader would type it (the refresh command's --out)
    elsewhere: dict[str, dict] = field(default_factory=dict)  # environments of carried rows' runs on other machines
    notes: Footnotes = field(default_factory=Footnotes)
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, store: Store, run_id: str, suites: dict[str, Suite], folder: str | None = None,
           exclude: frozenset[str] = frozenset()) -> "Board":
        """The board of ``run_id`` in ``store``, drawn by ``suites``; ``folder``: the board folder its commands
        name; ``exclude``: runs whose rows it never takes (held back)."""
        results, jobs = board_rows(store, run_id, exclude)
        cards: dict[str, dict] = {}
        for job in jobs.itertuples():  # newest first: a variant's card is the one its latest job recorded
            cards.setdefault(job.variant, job.provenance)
        current = current_sources(jobs)
        stale = _is_stale(jobs.variant, _job_hashes(jobs), current)
        stale_jobs, jobs = [jobs.loc[stale]], jobs.loc[~stale]
        results = results.loc[~_is_stale(results.variant, results.source_sha256, current)]
        results = upgrade_rows(results, suites, _environments(store, results))
        carried, elsewhere, here = {}, {}, machine_kind(store.environment(run_id))
        for name, suite in suites.items():
            if suite.carried:
                rows, dropped = _carried_rows(store, name, current,
                                              set(cards) - set(results.variant[results.suite == name]))
                if not rows.empty:
                    environments = _environments(store, rows)
                    carried[name] = upgrade_rows(rows, suites, environments)
                    elsewhere.update({run: env for run, env in environments.items() if machine_kind(env) != here})
                    stale_jobs = [part[(part.suite != name) | ~part.variant.isin(set(rows.variant))]
                                  for part in stale_jobs]  # shown on their current source after all
                if not dropped.empty:  # an empty frame has no columns: a second carried suite could not read it
                    named = {v for part in stale_jobs for v in part.variant[part.suite == name]}
                    stale_jobs.append(dropped[~dropped.variant.isin(named)])
        stale_jobs = [part for part in stale_jobs if not part.empty]
        return cls(run_id, store.settings(run_id), store.environment(run_id), results, jobs, cards, suites, carried,
                   pd.concat(stale_jobs, ignore_index=True) if stale_jobs else pd.DataFrame(), folder, elsewhere)

    # --- who is on it -----------------------------------------------------------------------------------

    @property
    def variants(self) -> list[str]:
        """Every variant on the board, sorted."""
        return sorted(self.cards)

    def card(self, variant: str) -> dict:
        """The card ``variant`` recorded with its latest job (summary, tags, claims, targets...)."""
        return self.cards.get(variant, {}).get("card", {})

    def kind(self, variant: str) -> str:
        """'core' or 'layer': what the variant is compared like with."""
        return kind_of(self.card(variant))

    def primary_mode(self, variant: str) -> str:
        """The mode its figures are read in wherever the board compares variants: :attr:`Tags.primary_mode` of the
        capabilities its card recorded ('causal' for a variant that computes only its causal form, else 'full')."""
        recorded = self.card(variant).get("tags", {})
        return Tags(**{f.name: recorded[f.name] for f in fields(Tags) if f.name in recorded}).primary_mode

    def in_primary_mode(self, rows):
        """The rows each in its variant's primary mode (rows about a comparator follow the variant they were
        measured beside)."""
        modes = rows.variant.map(self.primary_mode) if len(rows) else rows.variant
        return rows[rows["mode"] == modes]

    def suite(self, name: str) -> Suite:
        """The suite named, registered or implicit."""
        return self.suites.get(name) or implicit_suite(name)

    def suite_order(self) -> list[str]:
        """Every registered suite and every suite with rows on the board, in board order."""
        names = dict.fromkeys([*self.suites, *self.results.suite.unique(), *self.carried])
        return sorted(names, key=lambda n: self.suite(n).order)

    # --- its rows ---------------------------------------------------------------------------------------

    def rows(self, suite: str | None = None, variant: str | None = None) -> pd.DataFrame:
        """The suite's rows on the board: its accumulated ones and (a carried suite) each other variant's latest on
        its current source from any run (``suite`` None: every suite's accumulated rows); ``variant``: only that
        variant's. Split once per results frame: a render asks for them thousands of times, and filtering the whole
        frame for each was a large part of its time."""
        derived = self._derived_from_results()
        split = derived.setdefault("split", {})
        if suite not in split:
            if suite is None:
                whole = self.results
            else:
                if "suites" not in derived:
                    derived["suites"] = dict(tuple(self.results.groupby("suite", sort=False)))
                whole = derived["suites"].get(suite, self.results.iloc[:0])
                if suite in self.carried:  # the variants with no rows of their own source among the accumulated
                    whole = pd.concat([whole, self.carried[suite]], ignore_index=True) if not whole.empty \
                        else self.carried[suite]
            split[suite] = (whole, dict(tuple(whole.groupby("variant", sort=False))))
        whole, by_variant = split[suite]
        return whole if variant is None else by_variant.get(variant, whole.iloc[:0])

    def timing_form_of(self, suite: str, variant: str) -> str | None:
        """The timing form (:data:`zoo.checks.TIMING_FORM`) of the run the variant's rows of ``suite`` come from;
        None where it has none or they were carried from any run."""
        rows = self.rows(suite, variant)
        forms = set(rows.timing_form.dropna()) if "timing_form" in rows else set()
        return forms.pop() if len(forms) == 1 else None

    def runs_of(self, suite: str) -> list[str]:
        """The runs the suite's rows on the board come from."""
        return sorted(set(self.rows(suite).run_id))

    def source_text(self, suite: str) -> str:
        """Where the suite's rows come from, for its section ('this run', 'run X', ...)."""
        return runs_text(self.runs_of(suite), self.run_id)

    def machines_text(self, suite: str) -> str:
        """' Run X was on Intel Xeon (...).': the kind of machine of each run the suite's rows come from that is not
        the board's (a carried suite's rows may come from any run); '' where there is none."""
        machines: dict[str, list[str]] = {}
        for run in self.runs_of(suite):
            if run in self.elsewhere:
                machines.setdefault(machine_text(self.elsewhere[run]), []).append(run)
        named = {machine: runs_text(runs, self.run_id) for machine, runs in machines.items()}
        return "".join(f" {text[0].upper()}{text[1:]} {'was' if len(machines[machine]) == 1 else 'were'} on "
                       f"{machine}, not this board's kind of machine." for machine, text in named.items())

    def settings_of(self, suite: str):
        """``suite``'s settings in this board's run (a run stored before they were nested: through its legacy names)."""
        from .profiles import Profile

        return Profile.from_dict(self.settings, self.suites).of(suite)

    def value(self, variant: str | None, check: str, mode: str = "", phase: str = "", n=None,
              rows: pd.DataFrame | None = None, versus: str = "", field: str = "value", batch=None):
        """The (last) value of ``check`` for ``variant`` at (mode, phase, n), or None; ``versus``: the row about
        (or compared with) that callable instead of the variant's own; ``field``: low or high for the ends of the
        value's interval; ``batch``: the rows at that batch size (a suite that measures at several)."""
        if rows is None:
            records = self._records_of(check, mode, phase, versus)
        else:
            chosen = (rows.check == check) & (rows["mode"] == mode) & (rows.phase == phase) & (rows.versus == versus)
            records = rows[chosen].to_dict("records")
        for record in reversed(records):
            if all(wanted is None or (not pd.isna(record[key]) and record[key] == wanted)
                   for key, wanted in (("variant", variant), ("n", n), ("batch", batch))) and not pd.isna(record[field]):
                return float(record[field])
        return None

    def _records_of(self, check: str, mode: str, phase: str, versus: str) -> list[dict]:
        """The results rows of one (check, mode, phase, versus) as records, in their order, from an index built
        once per results frame: a render asks :meth:`value` thousands of times, and filtering the whole frame for
        each was most of its time."""
        derived = self._derived_from_results()
        if "records" not in derived:
            index = derived["records"] = {}
            for record in self.results.to_dict("records"):
                index.setdefault(tuple(record[key] for key in ("check", "mode", "phase", "versus")), []).append(record)
        return derived["records"].get((check, mode, phase, versus), [])

    def drift(self, suite: str, check: str, comparators, mode: str, phase: str, n, batch=None
              ) -> tuple[float, float] | None:
        """How far the machine itself drifted over the run at one cell: the same comparator call (one of
        ``comparators``), timed beside each variant in its own job, landed from (smallest / median, largest /
        median) of that call's times over the run's jobs. Every absolute time on the board carries this drift; a
        ratio measured in the same rounds as its comparator does not. A comparator call a later timing form changed
        (:data:`zoo.checks.TIMING_FORM_CHANGES`) is another call in runs before it, so each version of a call is
        taken relative to its own median. None where fewer than three jobs timed one version there."""
        return self._drift_cells(suite, check, comparators).get(_cell_key(mode, phase, n, batch))

    def drifts(self, suite: str, check: str, comparators) -> list[float]:
        """Every cell's :meth:`drift` as its width, (largest - smallest) / median, for a board's summary line."""
        return [high - low for low, high in self._drift_cells(suite, check, comparators).values()]

    def _drift_cells(self, suite: str, check: str, comparators) -> dict[tuple, tuple[float, float]]:
        derived = self._derived_from_results()
        key = ("drift", suite, check, tuple(comparators))
        if key not in derived:
            rows = self.rows(suite)
            rows = rows[(rows.check == check) & rows.versus.isin(list(comparators)) & (rows.value > 0)]
            forms = rows.timing_form if "timing_form" in rows else [None] * len(rows)  # a board not from a store
            rows = rows.assign(call=[len(form_changes(form, versus, mode)) if isinstance(form, str) else -1
                                     for form, versus, mode in zip(forms, rows.versus, rows["mode"])])
            relative: dict[tuple, list[float]] = {}
            for (mode, phase, n, batch, *_), group in rows.groupby(["mode", "phase", "n", "batch", "versus", "call"],
                                                                   dropna=False):
                if len(group) >= 3:
                    relative.setdefault(_cell_key(mode, phase, n, batch), []).extend(group.value / group.value.median())
            derived[key] = {cell: (float(min(values)), float(max(values))) for cell, values in relative.items()}
        return derived[key]

    def _derived_from_results(self) -> dict:
        """What :meth:`rows` and :meth:`value` derive from the results frame (its splits and index), made again
        when the frame is replaced."""
        if self._derived.get("frame") is not self.results:
            self._derived = {"frame": self.results}
        return self._derived

    # --- rows of an older source ------------------------------------------------------------------------

    def stale(self, variant: str) -> dict[str, list[str]]:
        """The suites whose rows of ``variant`` measured an older source and were dropped: suite -> runs."""
        jobs = self.stale_jobs
        if jobs.empty:
            return {}
        mine = jobs[jobs.variant == variant]
        return {suite: sorted(set(mine[mine.suite == suite].run_id))
                for suite in sorted(set(mine.suite), key=lambda n: self.suite(n).order)}

    def unfinished(self, suite: str, variant: str) -> tuple[str, str] | None:
        """(kind, whole reason) where the worker of ``variant``'s ``suite`` job did not finish (None: it did), so a
        figure it leaves missing says why ('timed out') rather than only that it is missing. The kind is the
        failure row's own (:data:`zoo.runner.UNFINISHED`); a row stored before it had one: 'did not finish'."""
        rows = self.rows(suite, variant)
        rows = rows[rows.check == WORKER_CHECK]
        if rows.empty:
            return None
        last = rows.iloc[-1]
        params = last.params if isinstance(last.params, dict) else {}
        return str(params.get("unfinished") or "did not finish"), str(last.detail)

    def refresh_command(self, variant: str, suites: list[str], markdown: bool = False) -> str:
        """The command that measures ``suites`` of ``variant`` on its current source onto this board (``markdown``:
        as code), or what to do where no command rebuilds the board's settings."""
        import shlex

        from .profiles import run_arguments

        arguments = run_arguments(self.settings, self.suites, suites)
        if arguments is None:
            return (f"no zoo run option rebuilds this board's settings: run {variant} through the Python API with "
                    f"the settings of run {self.run_id}")
        words = ["zoo", "run", variant, *[part for name in suites for part in ("--suite", name)], *arguments]
        if self.folder:
            words += ["--out", self.folder]
        command = " ".join(shlex.quote(word) for word in words)
        return f"`{command}`" if markdown else command

    # --- the ranking ------------------------------------------------------------------------------------

    @property
    def ranking_suite(self) -> Suite | None:
        """The suite that ranks (the first by order), if any."""
        return next((s for s in sorted(self.suites.values(), key=lambda s: s.order) if s.ranking), None)

    @functools.cached_property
    def standings(self):
        """Each variant's :class:`zoo.ranking.Standing` (computed once)."""
        from .ranking import gate

        return gate(self.results, self.suites, {v: list(self.stale(v)) for v in self.variants})

    def ranked(self, variant: str) -> bool:
        """Whether ``variant`` passes the gate."""
        return variant in self.standings and self.standings[variant].ranked

    def rank_figure(self, variant: str) -> RankFigure | None:
        """What the ranking suite ranks ``variant`` by on this board (None: no suite ranks)."""
        suite = self.ranking_suite
        return suite.ranking.figure(self, variant) if suite else None

    def required_suites(self) -> list[str]:
        """The suites ranking waits for, in board order."""
        return [name for name, suite in sorted(self.suites.items(), key=lambda item: item[1].order) if suite.required]


def _cell_key(mode, phase, n, batch) -> tuple:
    """A timed cell as a dictionary key: n and batch as floats (the frame's), None where absent."""
    return mode, phase, None if n is None or pd.isna(n) else float(n), None if batch is None or pd.isna(batch) else float(batch)


def checked_by(rows: pd.DataFrame, suite: str) -> bool:
    """Whether ``suite`` ran on these rows' variant and passed something."""
    return bool(((rows.suite == suite) & (rows.status == PASSED)).any())
