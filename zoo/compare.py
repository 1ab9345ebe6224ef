"""Compare two runs from the store: what got slower or faster beyond the measured noise, which checks
started or stopped failing, and which fitted exponents moved."""

from __future__ import annotations

import pandas as pd

EXPONENTS = ("flops-exponent", "memory-exponent", "time-exponent")
EXPONENT_MOVE = 0.1
NOISE_FLOOR = 0.05  # timings of the same code in two processes were seen to differ by about 5% here


def _keyed(frame: pd.DataFrame, checks) -> pd.DataFrame:
    rows = frame[frame.check.isin(checks)].copy()
    rows["n"] = rows.n.astype("Int64").astype(str)
    return rows.set_index(["variant", "check", "mode", "phase", "n"])


def timing_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Median times that moved by more than the larger of the two runs' interquartile ranges (and 5%)."""
    ta, tb = _keyed(a, ["time"]).value, _keyed(b, ["time"]).value
    ia = _keyed(a, ["time-iqr"]).value.rename(index={"time-iqr": "time"}, level="check")
    ib = _keyed(b, ["time-iqr"]).value.rename(index={"time-iqr": "time"}, level="check")
    both = pd.concat({"before": ta, "after": tb, "iqr_before": ia, "iqr_after": ib}, axis=1).dropna(subset=["before", "after"])
    noise = pd.concat([both.iqr_before, both.iqr_after, both.before * NOISE_FLOOR], axis=1).max(axis=1)
    moved = both[(both.after - both.before).abs() > noise]
    out = moved.assign(ratio=moved.after / moved.before, change=lambda f: f.ratio.map(lambda r: "slower" if r > 1 else "faster"))
    return out.reset_index()[["variant", "mode", "phase", "n", "before", "after", "ratio", "change"]]


def status_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Checks (per variant, check and setting) whose worst status went to or from failed/error."""
    def worst(frame):
        bad = frame.status.isin(["failed", "error"])
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
