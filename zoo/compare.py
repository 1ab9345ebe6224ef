"""Compare two runs from the store: what got slower or faster beyond the measured noise, which checks
started or stopped failing, and which fitted exponents moved."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .checks import BAD

EXPONENTS = ("flops-exponent", "memory-exponent", "time-exponent")
EXPONENT_MOVE = 0.1
PRACTICAL_CHANGE = 0.10
"""Smallest change reported: the same code timed in two processes here was seen to differ by about 5%,
which per-round samples from within one process cannot show, so a change must also exceed 10%."""
RESAMPLES, CONFIDENCE = 2000, 0.95
SETTINGS_COMPARED = ("name", "threads", "dtype", "device", "speed_batch", "speed_d_model", "speed_heads",
                     "repeats", "round_seconds", "variant_options")
ENVIRONMENT_COMPARED = ("cpu", "device", "torch", "python", "allocator", "threads")


def _keyed(frame: pd.DataFrame, checks) -> pd.DataFrame:
    rows = frame[frame.check.isin(checks)].copy()
    rows["n"] = rows.n.astype("Int64").astype(str)
    return rows.set_index(["variant", "check", "mode", "phase", "n"])


def ratio_interval(before: list[float], after: list[float], seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(after) / median(before), resampling each run's rounds."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    ratios = (np.median(rng.choice(b, (RESAMPLES, len(b))), axis=1)
              / np.median(rng.choice(a, (RESAMPLES, len(a))), axis=1))
    tail = (1 - CONFIDENCE) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


def timing_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Median times (ms) whose ratio after/before has a 95% bootstrap interval (over each run's per-round
    samples) that excludes 1, and whose ratio is beyond the 10% practical threshold."""
    ta, tb = _keyed(a, ["time"]), _keyed(b, ["time"])
    both = ta[["value", "samples"]].merge(tb[["value", "samples"]], left_index=True, right_index=True, suffixes=("_a", "_b"))
    rows = []
    for key, row in both.dropna(subset=["value_a", "value_b"]).iterrows():
        before, after = row.samples_a, row.samples_b
        if isinstance(before, list) and isinstance(after, list) and before and after:
            low, high = ratio_interval(before, after)
            test = f"bootstrap over {len(before)}+{len(after)} rounds"
        else:  # a run stored before per-round samples were kept: the point estimate alone
            low = high = row.value_b / row.value_a
            test = "no per-round samples: point estimate only"
        ratio = row.value_b / row.value_a
        if (low > 1 or high < 1) and abs(ratio - 1) > PRACTICAL_CHANGE:
            variant, _, mode, phase, n = key
            rows.append({"variant": variant, "mode": mode, "phase": phase, "n": n,
                         "before (ms)": row.value_a * 1e3, "after (ms)": row.value_b * 1e3, "after / before": ratio,
                         "95% interval": f"{low:.3g}-{high:.3g}", "change": "slower" if ratio > 1 else "faster",
                         "test": test})
    return pd.DataFrame(rows)


def differences(settings_a: dict, settings_b: dict, env_a: dict, env_b: dict) -> list[str]:
    """What differs between two runs that makes their timings not like for like."""
    notes = []
    for label, keys, x, y in (("setting", SETTINGS_COMPARED, settings_a, settings_b),
                              ("environment", ENVIRONMENT_COMPARED, env_a, env_b)):
        for key in keys:
            if x.get(key) != y.get(key):
                notes.append(f"{label} {key} differs: {x.get(key)!r} (before) vs {y.get(key)!r} (after)")
    return notes


def status_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Checks (per variant, check and setting) whose worst status went to or from failed/error."""
    def worst(frame):
        bad = frame.status.isin(BAD)
        return frame.assign(bad=bad).groupby(["variant", "suite", "check", "setting"]).bad.any()

    before, after = worst(a), worst(b)
    both = pd.concat({"before": before, "after": after}, axis=1).dropna()
    changed = both[both.before != both.after]
    out = changed.assign(change=changed.after.map(lambda bad: "started failing" if bad else "stopped failing"))
    return out.reset_index()[["variant", "suite", "check", "setting", "change"]]


def exponent_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    ea, eb = _keyed(a, EXPONENTS).value, _keyed(b, EXPONENTS).value
    both = pd.concat({"before": ea, "after": eb}, axis=1).dropna()
    moved = both[(both.after - both.before).abs() > EXPONENT_MOVE]
    return moved.reset_index()[["variant", "check", "mode", "phase", "before", "after"]]
