"""`zoo compare` decides slower/faster from per-round samples with a stated test, and says when two runs
are not like for like."""

import numpy as np
import pytest
import pandas as pd

from zoo.compare import differences, ratio_interval, timing_changes


def _run(samples: list[float]) -> pd.DataFrame:
    median = sorted(samples)[len(samples) // 2]
    return pd.DataFrame([{"variant": "v", "check": "time", "versus": "", "mode": "full", "phase": "fwd", "n": 1024, "unit": "s",
                          "status": "measured", "value": median, "samples": samples}])


def test_a_large_slowdown_is_reported_even_when_the_rounds_are_noisy():
    before = _run([7.7e-3, 7.5e-3, 7.9e-3, 30e-3, 7.6e-3])
    after = _run([42.4e-3, 40e-3, 45e-3, 120e-3, 41e-3])
    changes = timing_changes(before, after)
    assert list(changes.change) == ["slower"]
    assert 5 < changes["after / before"].iloc[0] < 6 and changes["after (ms)"].iloc[0] > 40


def test_two_samples_of_the_same_distribution_report_no_change():
    before = _run([10.0e-3, 10.4e-3, 9.8e-3, 10.1e-3, 10.3e-3])
    after = _run([10.2e-3, 9.9e-3, 10.5e-3, 10.0e-3, 10.1e-3])
    assert timing_changes(before, after).empty
    low, high = ratio_interval(before.samples[0], after.samples[0])
    assert low < 1 < high


def test_differences_name_the_setting_and_environment_that_changed():
    notes = differences({"threads": 2, "name": "quick", "suites": {"speed": {"repeats": [3]}}},
                        {"threads": 1, "name": "quick", "suites": {"speed": {"repeats": [5]}}},
                        {"torch": "2.13.0"}, {"torch": "2.12.0"})
    assert any("setting speed.repeats differs: (3,) (before) vs (5,) (after)" in note for note in notes)
    assert any("threads differs: 2 (before) vs 1 (after)" in note for note in notes)
    assert any("environment torch differs" in note for note in notes)
    assert not any("timing_form" in note for note in notes)  # neither recorded one: both the first form


def test_differences_name_a_run_that_called_what_it_timed_differently():
    """A run from before nn.MultiheadAttention was told is_causal (no timing_form recorded) against one after."""
    notes = differences({}, {}, {}, {"timing_form": "2"})
    assert notes == ["environment timing_form differs: '1' (before) vs '2' (after)"]


def test_the_interval_covers_no_change_as_often_as_it_says():
    """Before and after drawn from one distribution: a 95% interval of the ratio contains 1 about 95% of the time
    (each run's rounds resampled; a 90% interval, or one that kept the before median fixed, falls short)."""
    rng = np.random.default_rng(7)
    trials, covered = 1500, 0
    for trial in range(trials):
        before, after = (list(np.exp(rng.normal(0, 0.05, 11))) for _ in range(2))
        low, high = ratio_interval(before, after, seed=trial)
        covered += low <= 1 <= high
    assert 0.95 <= covered / trials <= 0.98, covered / trials


def test_a_suite_that_became_an_error_is_a_check_that_started_failing():
    from zoo.compare import status_changes

    def rows(*records):
        return pd.DataFrame([dict(zip(("variant", "suite", "check", "status"), r), versus="", setting="") for r in records])

    before = rows(("additive", "speed", "time", "measured"), ("linear", "speed", "time", "measured"),
                  ("linear", "quality", "accuracy", "measured"))
    after = rows(("additive", "speed", "worker", "error"), ("linear", "speed", "time", "measured"),
                 ("additive", "quality", "worker", "error"))  # additive's quality never ran before: not a change
    changes = status_changes(before, after)
    assert changes[["variant", "suite", "check", "change"]].values.tolist() == [
        ["additive", "speed", "worker", "started failing"]]


def test_status_changes_of_runs_without_rows_is_empty():
    from zoo.compare import status_changes

    empty = pd.DataFrame(columns=["variant", "suite", "check", "versus", "setting", "status"])
    assert status_changes(empty, empty).empty


def test_a_negative_fitted_exponent_that_moved_is_explained_and_a_positive_one_is_not():
    from zoo.compare import NEGATIVE_EXPONENT, exponent_changes

    def run(value, variant):
        return pd.DataFrame([{"variant": variant, "check": "time-exponent", "versus": "", "mode": "full",
                              "phase": "fwd", "n": None, "unit": "exponent", "status": "measured", "value": value}])

    before = pd.concat([run(0.3, "linear"), run(1.0, "dense")])
    after = pd.concat([run(-0.212, "linear"), run(1.9, "dense")])
    notes = dict(zip(exponent_changes(before, after).variant, exponent_changes(before, after).note))
    assert notes == {"linear": NEGATIVE_EXPONENT, "dense": ""}


def test_compare_runs_is_the_python_api_zoo_compare_prints(tmp_path, capsys):
    """The command only prints what :func:`zoo.compare.compare_runs` returns: the same runs and tables."""
    from zoo.checks import Result
    from zoo.cli import main
    from zoo.compare import compare_runs
    from zoo.store import Store

    store = Store(tmp_path / "results.sqlite")
    runs = []
    for started, base in (("2026-01-01 00:00:00", 1.0), ("2026-01-01 01:00:00", 2.0)):
        run = store.start_run({"name": "quick", "threads": 2}, {"device": "cpu"}, started)
        samples = [base * (1 + 0.01 * i) for i in range(8)]
        store.record_job(run, "v", "speed", "done", 1.0, {}, [Result(
            "time", "measured", "full fwd n=64", samples[4], "s", n=64, mode="full", phase="fwd",
            samples=samples).as_dict()])
        runs.append(run)
    comparison = compare_runs(tmp_path, runs[0], runs[1][:len(runs[1]) - 2])  # a unique prefix names a run
    assert (comparison.before, comparison.after) == tuple(runs) and comparison.warnings == []
    title, slower = comparison.tables[0]
    assert title.startswith("Timing changes") and list(slower.change) == ["slower"]
    assert slower["after / before"].iloc[0] == pytest.approx(2.0)
    assert main(["compare", runs[0], runs[1], "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"comparing {runs[0]} (before) with {runs[1]} (after)" in printed
    assert all(f"## {title}" in printed for title, _ in comparison.tables) and "| slower" in printed


def test_compare_warns_when_one_run_is_far_noisier_than_the_other(tmp_path):
    """Two runs whose timings spread 2% and 40% (IQR/median): the changes between them are mostly the noisy
    run's noise, and the comparison says so by the board's own held-back rule."""
    from zoo.checks import Result
    from zoo.compare import compare_runs
    from zoo.store import Store

    store = Store(tmp_path / "results.sqlite")
    runs = []
    for started, spread in (("2026-01-01 00:00:00", 0.02), ("2026-01-01 01:00:00", 0.4)):
        run = store.start_run({"name": "quick", "threads": 2}, {"device": "cpu"}, started)
        store.record_job(run, "v", "speed", "done", 1.0, {}, [Result(
            "time-spread", "measured", "full fwd n=64", spread, "IQR/median", n=64, mode="full",
            phase="fwd").as_dict()])
        runs.append(run)
    warnings = compare_runs(tmp_path, *runs).warnings
    assert len(warnings) == 1 and warnings[0].startswith(f"run {runs[1]} is far noisier than run {runs[0]}")
    assert "mostly noise" in warnings[0]
    assert compare_runs(tmp_path, runs[0], runs[0]).warnings == []
