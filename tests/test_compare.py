"""`zoo compare` decides slower/faster from per-round samples with a stated test, and says when two runs
are not like for like."""

import pandas as pd

from zoo.compare import differences, ratio_interval, timing_changes


def _run(samples: list[float]) -> pd.DataFrame:
    median = sorted(samples)[len(samples) // 2]
    return pd.DataFrame([{"variant": "v", "check": "time", "mode": "full", "phase": "fwd", "n": 1024,
                          "value": median, "samples": samples}])


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
    notes = differences({"threads": 2, "name": "quick"}, {"threads": 1, "name": "quick"},
                        {"torch": "2.13.0"}, {"torch": "2.12.0"})
    assert any("threads differs: 2 (before) vs 1 (after)" in note for note in notes)
    assert any("environment torch differs" in note for note in notes)
