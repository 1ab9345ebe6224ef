"""Compare two runs from the store: what got slower or faster beyond the measured uncertainty, which checks
started or stopped failing, and which fitted exponents moved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from .checks import BAD
from .environment import timing_form

EXPONENT_MOVE = 0.1
PRACTICAL_CHANGE = 0.05
"""Smallest change reported between runs whose figures state intervals over several processes."""
PRACTICAL_CHANGE_ONE_PROCESS = 0.10
"""Smallest change reported otherwise: the same code timed in two processes here differs by more than per-round
samples from within one process can show."""
RESAMPLES, CONFIDENCE = 2000, 0.95
RUN_SETTINGS_COMPARED = ("name", "threads", "processes", "dtype", "device", "variant_options")
ENVIRONMENT_COMPARED = ("cpu", "device", "torch", "python", "allocator", "threads", "timing_form")


def _keyed(frame: pd.DataFrame, unit: str) -> pd.DataFrame:
    """The measurements in ``unit`` (seconds: timings; exponent: fitted exponents), keyed by what they measure."""
    rows = frame[(frame.unit == unit) & frame.value.notna()].copy()
    rows["n"] = rows.n.astype("Int64").astype(str)
    for column in ("low", "high"):  # a run stored before rows stated an interval has none
        rows[column] = rows[column] if column in rows else np.nan
    return rows.set_index(["variant", "check", "versus", "mode", "phase", "n"])


def ratio_interval(before: list[float], after: list[float], seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(after) / median(before), resampling each run's rounds."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    ratios = (np.median(rng.choice(b, (RESAMPLES, len(b))), axis=1)
              / np.median(rng.choice(a, (RESAMPLES, len(a))), axis=1))
    tail = (1 - CONFIDENCE) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


def timing_changes(a: pd.DataFrame, b: pd.DataFrame, intervals: bool = True) -> pd.DataFrame:
    """Median times (ms) that changed beyond their uncertainty and beyond a practical threshold. With
    ``intervals`` (both runs timed in several processes) the uncertainty is the one the board states: where both
    give a time's interval (its processes' medians and rounds, :mod:`zoo.timing`), the ratio after/before is
    uncertain from after's low / before's high to after's high / before's low, a change only when that excludes
    1 (the intervals do not overlap) and exceeds 5%; otherwise a 95% bootstrap interval over each run's per-round
    samples must exclude 1 and the change exceed 10%."""
    ta, tb = (_keyed(frame, "s") for frame in (a, b))
    ta, tb = (frame[frame.samples.map(bool).astype(bool)] for frame in (ta, tb))  # the timed cells: per-round samples behind each
    columns = ["value", "samples", "low", "high"]
    both = ta[columns].merge(tb[columns], left_index=True, right_index=True, suffixes=("_a", "_b"))
    rows = []
    for key, row in both.dropna(subset=["value_a", "value_b"]).iterrows():
        before, after = row.samples_a, row.samples_b
        practical = PRACTICAL_CHANGE_ONE_PROCESS
        if intervals and not pd.isna([row.low_a, row.high_a, row.low_b, row.high_b]).any() and row.low_a > 0:
            low, high = row.low_b / row.high_a, row.high_b / row.low_a
            test, practical = "stated intervals (processes and rounds) do not overlap", PRACTICAL_CHANGE
        elif isinstance(before, list) and isinstance(after, list) and before and after:
            low, high = ratio_interval(before, after)
            test = f"bootstrap over {len(before)}+{len(after)} rounds"
        else:  # a run stored before per-round samples were kept: the point estimate alone
            low = high = row.value_b / row.value_a
            test = "no per-round samples: point estimate only"
        ratio = row.value_b / row.value_a
        if (low > 1 or high < 1) and abs(ratio - 1) > practical:
            variant, check, versus, mode, phase, n = key
            rows.append({"variant": variant, "measure": _measure(check, versus), "mode": mode, "phase": phase, "n": n,
                         "before (ms)": row.value_a * 1e3, "after (ms)": row.value_b * 1e3, "after / before": ratio,
                         "interval": f"{low:.3g}-{high:.3g}", "change": "slower" if ratio > 1 else "faster",
                         "test": test})
    return pd.DataFrame(rows)


def _measure(check: str, versus: str) -> str:
    """A row's kind as a person reads it: 'time', or 'time (torch-sdpa)' for another callable's."""
    return f"{check} ({versus})" if versus else check


def differences(settings_a: dict, settings_b: dict, env_a: dict, env_b: dict) -> list[str]:
    """What differs between two runs that makes their timings not like for like."""
    notes = []
    flat_a, flat_b = (_flat(settings) for settings in (settings_a, settings_b))
    env_a, env_b = ({**env, "timing_form": timing_form(env)} for env in (env_a, env_b))
    suite_keys = sorted(k for k in set(flat_a) | set(flat_b) if "." in k)
    for label, keys, x, y in (("setting", [*RUN_SETTINGS_COMPARED, *suite_keys], flat_a, flat_b),
                              ("environment", ENVIRONMENT_COMPARED, env_a, env_b)):
        for key in keys:
            if x.get(key) != y.get(key):
                notes.append(f"{label} {key} differs: {x.get(key)!r} (before) vs {y.get(key)!r} (after)")
    return notes


def _flat(settings: dict) -> dict:
    """A run's settings with each suite's as SUITE.KEY (lists as tuples, so a JSON round trip changes nothing)."""
    flat = {k: v for k, v in settings.items() if k != "suites"}
    for suite, values in (settings.get("suites") or {}).items():
        flat.update({f"{suite}.{key}": tuple(v) if isinstance(v, list) else v for key, v in values.items()})
    return flat


def status_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Checks (per variant, check and setting) whose worst status went to or from failed/error, among the
    (variant, suite) pairs both runs ran: a row only one run has counts as not failing in the other (a job
    that became an error has an error row where its checks' rows were)."""
    def worst(frame):
        bad = frame.status.isin(BAD)
        return frame.assign(bad=bad).groupby(["variant", "suite", "check", "versus", "setting"]).bad.any()

    before, after = worst(a), worst(b)
    both = pd.concat({"before": before, "after": after}, axis=1)
    ran = set(zip(a.variant, a.suite)) & set(zip(b.variant, b.suite))
    both = both.loc[np.array([(variant, suite) in ran for variant, suite, *_ in both.index], dtype=bool)].fillna(False)
    changed = both[both.before != both.after]
    out = changed.assign(change=changed.after.map(lambda bad: "started failing" if bad else "stopped failing"))
    out = out.reset_index()
    return out.assign(check=[_measure(c, v) for c, v in zip(out.check, out.versus)])[
        ["variant", "suite", "check", "setting", "change"]]


NEGATIVE_EXPONENT = ("below 0: the figure fell as n grew, so fixed costs (calls, copies, noise) outweigh the "
                     "growth at these lengths; it is not a growth rate")


def exponent_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Fitted exponents that moved by more than 0.1 between the runs, with a note where one is negative (no figure
    of an algorithm shrinks with its input: such a fit says the lengths were too short to show the growth)."""
    ea, eb = _keyed(a, "exponent").value, _keyed(b, "exponent").value
    both = pd.concat({"before": ea, "after": eb}, axis=1).dropna()
    moved = both[(both.after - both.before).abs() > EXPONENT_MOVE].reset_index()
    return moved.assign(check=[_measure(c, v) for c, v in zip(moved.check, moved.versus)],
                        note=[NEGATIVE_EXPONENT if min(x, y) < 0 else "" for x, y in zip(moved.before, moved.after)])[
        ["variant", "check", "mode", "phase", "before", "after", "note"]]


@dataclass(frozen=True)
class Comparison:
    """What changed between two runs of a board folder (``zoo compare``): the two runs, what the folder's join
    said (``notices``, lines as a command prints them), what makes their timings hard to compare
    (``warnings``), and the tables, each a title and its rows."""

    before: str
    after: str
    notices: list[str]
    warnings: list[str]
    tables: list[tuple[str, pd.DataFrame]]


def compare_runs(out: Path | str, before: str, after: str, suites: Mapping | None = None) -> Comparison:
    """Compare run ``before`` with run ``after`` of the board folder ``out`` (ids or unique prefixes), reading
    it only: their rows as today's suites read them (``suites``: the registry's, by default), timings judged
    by the runs' stated intervals (a bootstrap of their rounds where either was timed in one process)."""
    from .folder import BoardFolder, resolve_run
    from .leaderboard import held_back_reason, registered_suites, run_noise
    from .suite import upgrade_rows

    folder = BoardFolder(out)
    store = folder.for_reading()
    notices = folder.notices(writing=False)
    runs = [resolve_run(store, given, folder.database) for given in (before, after)]
    suites = registered_suites() if suites is None else suites
    a, b = (upgrade_rows(store.results(r).assign(run_id=r), suites, {r: store.environment(r)}) for r in runs)
    warnings = [f"{note}; timings may not be comparable"
                for note in differences(*(store.settings(r) for r in runs), *(store.environment(r) for r in runs))]
    noise = dict(zip(runs, (run_noise(store, r, suites) for r in runs)))
    for run, other in ((runs[1], runs[0]), (runs[0], runs[1])):
        if why := held_back_reason(noise[run], noise[other], against=f"run {other}'s"):
            warnings.append(f"run {run} is far noisier than run {other}, {why}: its timing changes are mostly noise")
    intervals = all((store.settings(r).get("processes") or 1) > 1 for r in runs)
    timing_title = ("Timing changes: the two runs' intervals over their processes do not overlap, and the change "
                    f"exceeds {PRACTICAL_CHANGE:.0%}" if intervals else "Timing changes: a 95% bootstrap interval of "
                    "the ratio of medians (over both runs' rounds) excludes 1, and the change exceeds "
                    f"{PRACTICAL_CHANGE_ONE_PROCESS:.0%} (a run timed in one process states no interval over "
                    "processes)")
    tables = [(timing_title, timing_changes(a, b, intervals)),
              ("Checks that started or stopped failing", status_changes(a, b)),
              (f"Fitted exponents that moved by more than {EXPONENT_MOVE:g}", exponent_changes(a, b))]
    return Comparison(runs[0], runs[1], notices, warnings, tables)
